"""The digital twin: a SimPy world that drives the control core in virtual time."""
