"""InferSim: predicts LLM inference speed and cost on given GPUs, module by module."""

__version__ = "0.1.0"
