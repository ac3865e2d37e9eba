"""The parameter servers' transport: the wire format (a JSON header and raw tensor
bytes, never pickle), gRPC between hosts, a uid-checked Unix socket with shared
memory on one host, and the chief's and workers' client of the servers.
"""
