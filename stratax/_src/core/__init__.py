"""Pure helpers every layer may use: environment variable names and reads, errors, the
replica-context state, logging, addresses and atomic files. No JAX or Keras imports at module
level, so the launcher and ``import stratax`` stay light (ARCHITECTURE.md, layer 0)."""
