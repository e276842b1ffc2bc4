"""The gRPC stubs of ``txoutbox.v1``, generated from the .proto files when the wheel was
built: ``relay_pb2`` / ``relay_pb2_grpc`` (``RelayStub``), ``admin_pb2`` /
``admin_pb2_grpc`` (``AdminStub``) and ``message_pb2``."""
