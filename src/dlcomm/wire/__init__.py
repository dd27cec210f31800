"""Pure protocol code: packet headers and fixed-point quantization (no sockets here)."""
