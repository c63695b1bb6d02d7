"""Builds the flatshard package, generating its gRPC stubs from proto/.

The stubs are generated at build time with grpcio-tools into the build tree as
the `flatshard.v1` subpackage (the proto package is `flatshard.v1`, so the
generated imports `from flatshard.v1 import common_pb2` resolve inside this
package). protobuf is pinned to the range the generating grpcio-tools
requires, so the runtime always accepts the generated code.
"""
import importlib.metadata
import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"


def protobuf_requirement() -> str:
    for requirement in importlib.metadata.requires("grpcio-tools") or []:
        name = requirement.split(";")[0]
        if name.replace(" ", "").startswith("protobuf"):
            return name.replace(" ", "")
    return "protobuf"


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        from grpc_tools import protoc  # a build requirement (pyproject.toml)

        protos = sorted(PROTO_ROOT.glob("flatshard/v1/*.proto"))
        if not protos:
            raise SystemExit(f"flatshard: no .proto files under {PROTO_ROOT}/flatshard/v1: "
                             "build the package from the flatshard repository (client/python)")
        out = pathlib.Path(self.build_lib)
        include = pathlib.Path(protoc.__file__).parent / "_proto"
        args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={out}",
                f"--pyi_out={out}", f"--grpc_python_out={out}"] + [str(p) for p in protos]
        if protoc.main(args) != 0:
            raise SystemExit("flatshard: grpc_tools.protoc failed on " + " ".join(map(str, protos)))
        (out / "flatshard" / "v1" / "__init__.py").write_text(
            '"""gRPC stubs generated from proto/flatshard/v1 at build time."""\n')


setup(
    cmdclass={"build_py": BuildWithStubs},
    install_requires=[f"grpcio>={importlib.metadata.version('grpcio-tools')}", "numpy>=1.21", "PyYAML>=5.4", protobuf_requirement()],
)
