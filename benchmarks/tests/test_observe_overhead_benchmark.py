"""``benchmarks/workloads/observe_overhead.py``'s per-step cost of ``WorkerMetrics``, measured
through Keras' public callback protocol (its ``fit`` runs take minutes:
``python -m benchmarks.workloads.observe_overhead --reps 5``)."""

from benchmarks.workloads import observe_overhead


def test_the_per_step_cost_times_the_callbacks_wrapper_of_the_train_function():
    # It raises if WorkerMetrics stopped wrapping model.train_function in on_train_begin (the
    # cost would then be of nothing); a few thousand calls take a fraction of a second.
    cost = observe_overhead._per_step_cost(reps=2, steps=2000)
    assert cost["min"] <= cost["us_per_step_median"] <= cost["max"]
    assert cost["max"] < 1000  # microseconds: the wrapper, not a step waited for
