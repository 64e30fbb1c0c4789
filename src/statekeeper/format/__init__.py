"""On-disk format version 1: manifest, tagged JSON values, safetensors shards, checksums."""
