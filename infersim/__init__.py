"""InferSim: predicts LLM inference speed and cost on given GPUs, module by module."""

__version__ = "0.1.0"

# before any submodule defines its dataclasses: their generated methods come compiled from the
# on-disk cache instead of being compiled again in every process (see infersim.codecache)
from infersim import codecache as _codecache

_codecache.install()
