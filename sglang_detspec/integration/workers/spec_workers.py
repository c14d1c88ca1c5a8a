"""Worker classes the DETSPEC algorithms' factories return.

Import this module only inside a factory (it imports SGLang's speculative
workers, which pull in the whole model-executor stack).
"""

from sglang_detspec.integration.workers.multi_layer import DetspecMultiLayerEagleWorkerV2
from sglang_detspec.integration.workers.single_layer import DetspecEAGLEWorkerV2

__all__ = ["DetspecEAGLEWorkerV2", "DetspecMultiLayerEagleWorkerV2"]
