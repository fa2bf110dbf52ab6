"""Request-level serving simulation on top of the stage engine (see infersim.serve.api)."""
