"""ParameterServerStrategy: servers, wire protocol, variables and partitioners, coordinator."""
