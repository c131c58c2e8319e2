"""byoc-openvino: Intel OpenVINO as a byoc target (entry point ``byoc: openvino = byoc_openvino.plugin``).

Importing this package is cheap: ``openvino`` itself is imported when byoc first asks the plugin
about a node, compiles a region or loads an artifact.
"""

__version__ = "0.1.0"

#: bump when the artifact's layout or the compile recipe changes
ARTIFACT_VERSION = 1

__all__ = ["ARTIFACT_VERSION", "__version__"]
