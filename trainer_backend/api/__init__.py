"""The Tinker wire layer: JSON schemas (`schemas`) and protobuf codecs (`proto`) for SDK 0.38; no server logic.

`WIRE.md` next to this file lists every route the SDK calls and what it sends and expects, with citations.
"""
