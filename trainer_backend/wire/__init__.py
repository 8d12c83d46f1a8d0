"""The Tinker wire format, below the service: JSON schemas (`schemas`), protobuf codecs (`proto`) and the status
view (`status`) for SDK 0.38; no server logic, and nothing here imports the service or the HTTP layer.

`WIRE.md` next to this file lists every route the SDK calls and what it sends and expects, with citations.
"""
