"""What runs under the strategies: devices, ``jax.distributed`` start-up and shutdown, the
collectives (gloo, the shared-memory all-reduce), TPU topology and step throttling
(ARCHITECTURE.md, layer 2; docs/transport.md)."""
