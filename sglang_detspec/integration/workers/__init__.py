"""The DETSPEC speculative workers and draft CUDA-graph runners: SGLang's own worker bodies, run with the DETSPEC
sampling names in place of upstream's unseeded ones.

* :mod:`.single_layer`   EAGLE / NEXTN / EAGLE3 (one draft layer);
* :mod:`.multi_layer`    multi-layer EAGLE (one MTP layer per draft step);
* :mod:`.spec_worker_base` what both spec workers share (construction, attention backends, verify);
* :mod:`.spec_workers`   the two worker classes the algorithms' factories return;
* :mod:`.draft_keys`     the per-row key buffers the draft CUDA graphs read;
* :mod:`.worker_checks`  the checks a worker makes on itself while it is built.

Importing this package imports nothing; each worker module imports SGLang's speculative stack.
"""
