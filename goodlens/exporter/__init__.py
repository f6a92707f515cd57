"""What runs inside training: the per-rank recorder, its transport and spill file, the host
relay client and the PyTorch integration (``goodlens.exporter.torch``).

Depends on ``goodlens.model`` alone and needs nothing beyond the standard library and pyarrow,
so a training image installs plain ``goodlens`` without the server's dependencies.

    from goodlens.exporter import RankExporter
"""

from goodlens.exporter.recorder import ExporterConfig, RankExporter

__all__ = ["ExporterConfig", "RankExporter"]
