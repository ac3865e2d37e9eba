"""The harness: plans, launches (one fresh child per repetition), times, summarizes, reports."""
