import protos  # noqa: F401  (first: gRPC fork support off before grpc loads; see protos/__init__.py)
