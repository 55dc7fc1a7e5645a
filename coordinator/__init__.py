"""The coordinator: the round loop (engine), the draft-length policy (adaptive), the draft side
of a request (drafting), the clients of both tiers, and the public gRPC GenerationService."""

from specdec._exports import lazy_exports

_EXPORTS = {
    "SpeculativeEngine": "engine",
    "EngineConfig": "engine",
    "GenerationRequest": "engine",
    "Delta": "engine",
    "FinishReason": "engine",
    "SpeculationStats": "engine",
    "Proposer": "drafting",
    "Verifier": "engine",
    "DraftLengthPolicy": "adaptive",
    "DraftClient": "clients",
    "DraftClientConfig": "clients",
    "GenerationServer": "server",
    "ServerConfig": "server",
    "connect_engine": "remote",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
