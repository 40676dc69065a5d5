"""TEI's gRPC API (`--grpc-port`): server.py serves tei.proto's services by running each RPC
as its TEI HTTP route in process. generated/ holds the stubs made from tei.proto (do not edit)."""
