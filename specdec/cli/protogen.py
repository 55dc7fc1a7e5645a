"""Regenerate the Python gRPC/protobuf code from protos/.

Run ``python -m specdec.cli.protogen`` after editing a .proto; the generated files
are committed so that runtime installs need no protoc, and
tests/deploy/test_protos.py fails when they drift from the .proto sources.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO_ROOT / "protos"


def generate(out_dir: Path) -> list[Path]:
    """Generate *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every .proto into out_dir.

    Returns the generated files, sorted.
    """
    # grpc_tools is a dev-only dependency; importing it lazily keeps this
    # module importable from a runtime install.
    from importlib.resources import files

    from grpc_tools import protoc

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Paths relative to PROTO_ROOT make the generated imports read
    # `from specdec.v1 import common_pb2`, matching the package layout.
    protos = sorted(p.relative_to(PROTO_ROOT).as_posix() for p in PROTO_ROOT.rglob("*.proto"))
    if not protos:
        raise RuntimeError(f"no .proto files under {PROTO_ROOT}")
    # grpc_tools bundles the well-known types (google/protobuf/*.proto);
    # protoc as a library does not add that include path by itself.
    well_known = str(files("grpc_tools") / "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed: " + " ".join(args))

    generated = []
    for proto in protos:
        stem = proto.removesuffix(".proto")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            path = out_dir / f"{stem}{suffix}"
            if not path.is_file():
                raise RuntimeError(f"protoc did not produce {path}")
            generated.append(path)
    return sorted(generated)


if __name__ == "__main__":
    for path in generate(REPO_ROOT):
        print(path.relative_to(REPO_ROOT))
