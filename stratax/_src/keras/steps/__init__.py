"""The train-step variants a runner compiles, and their parts: the packed all-reduce step, a group
of ``steps_per_execution`` steps as one program, the sharded optimizer update, rows kept on the
devices, forward-pass losses, metric resets and epoch logs, and the step plan (``plan``) that
runs them, chosen once per step function; docs/design/step-plan.md has the table of which plan
each strategy gets.
"""
