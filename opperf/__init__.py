"""opperf: a versioned operator-performance database for LLM-inference performance modelling."""

__version__ = "0.1.0"
