"""specdec: distributed speculative decoding for LLM serving.

The one import name of the project. Its layers, bottom up (docs/design.md): `core`, `runtime`,
`drafts` and `telemetry`, the services `draft_service`, `target_service` and `coordinator`, then
`local`, `distill`, `bench` and `cli`. Generated protobuf code lives in `specdec.v1`.
"""
