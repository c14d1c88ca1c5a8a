"""A stand-in ``sglang`` package for CPU tests of scripts that start ``python -m sglang.launch_server`` (put this
directory's parent first on the server's PYTHONPATH): see :mod:`.launch_server`."""
