"""The parameter servers' transport: the wire format (a JSON header and raw tensor
bytes, never pickle), gRPC with mutual TLS from the cluster's token, TCP sealed with
keys from that TLS between hosts, a uid-checked Unix socket with shared memory on one
host, and the chief's and workers' client of the servers.
"""
