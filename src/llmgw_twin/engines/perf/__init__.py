"""Engine performance: a pure continuous-batching model (`model.py`) and its coefficients as
data, per engine, model and GPU kind (`table.py`); `docs/engine-model.md` describes both."""
