"""Generates the gRPC stubs from ``proto/txoutbox/v1/*.proto`` into the wheel, as
``txoutbox_client.proto`` (``relay_pb2``, ``relay_pb2_grpc``, ``admin_pb2``...).

The generated modules import each other as ``txoutbox.v1``; they are rewritten to relative
imports, so that they live inside this package and another installed package named
``txoutbox`` (the original Python library is one) cannot shadow them. Nothing generated is
kept in the repository: each build writes the stubs into a temporary directory that the
wheel takes them from.
"""

import re
import shutil
import tempfile
from importlib import resources
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PROTOS = ("message", "relay", "admin")


class StubsHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version, build_data):
        if self.target_name != "wheel":
            return
        from grpc_tools import protoc

        source = self._proto_root()
        self._scratch = Path(tempfile.mkdtemp(prefix="txoutbox-stubs-"))
        well_known = resources.files("grpc_tools") / "_proto"
        arguments = [
            "grpc_tools.protoc",
            f"-I{source}",
            f"-I{well_known}",
            f"--python_out={self._scratch}",
            f"--pyi_out={self._scratch}",
            f"--grpc_python_out={self._scratch}",
            *(f"txoutbox/v1/{name}.proto" for name in PROTOS),
        ]
        if protoc.main(arguments) != 0:
            raise RuntimeError(f"protoc failed on the .proto files in {source}")
        generated = self._scratch / "txoutbox" / "v1"
        for path in sorted(generated.iterdir()):
            if path.suffix not in (".py", ".pyi"):
                continue
            text = re.sub(r"^from txoutbox\.v1 import ", "from . import ", path.read_text(),
                          flags=re.MULTILINE)
            path.write_text(text)
            build_data["force_include"][str(path)] = f"txoutbox_client/proto/{path.name}"

    def finalize(self, version, build_data, artifact_path):
        scratch = getattr(self, "_scratch", None)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)

    def _proto_root(self):
        """``proto/`` inside an sdist, else the repository's, two levels up."""
        root = Path(self.root)
        for candidate in (root / "proto", root.parent.parent / "proto"):
            if (candidate / "txoutbox" / "v1" / "relay.proto").is_file():
                return candidate
        raise RuntimeError(
            f"txoutbox/v1/*.proto not found in {root / 'proto'} nor in "
            f"{root.parent.parent / 'proto'}: build from the repository or from an sdist"
        )
