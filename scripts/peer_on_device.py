"""Runs the PyTorch peer (../shared/peers/torch_ling.py, not part of this repository) with its arguments,
for scripts/gpu_check.sh: python3 scripts/peer_on_device.py PEER ARGS...

The peer caches its RoPE tables and causal mask per sequence length on the CPU whatever the model's
device (its `_cached(T, device)` leaves `device` unused), so on a GPU its first forward fails with
"Expected all tensors to be on the same device". This keeps the peer's code as it is and moves each
cached table to the device the first time it is asked for there: the tables are the peer's, computed
by the peer, and a step reads them on the device as a PyTorch user's model would.
"""
import importlib.util
import sys


# The peer as a module (not as __main__, so that its main() waits until its classes are patched).
def load(path):
    spec = importlib.util.spec_from_file_location("torch_ling_peer", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # torch.compile looks the peer's functions up by their module's name
    spec.loader.exec_module(module)
    return module


def tables_on_device(cls):
    peer_cached = cls._cached

    def cached(self, T, device):
        cos, sin, mask = peer_cached(self, T, device)
        if cos.device != device:
            self._rope[T] = (cos.to(device), sin.to(device))
            self._mask[T] = mask.to(device)
        return self._rope[T][0], self._rope[T][1], self._mask[T]

    cls._cached = cached


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: peer_on_device.py PEER ARGS...")
    sys.argv = sys.argv[1:]  # the peer's own command line
    peer = load(sys.argv[0])  # a script without main() has run here
    for cls in [c for c in vars(peer).values() if isinstance(c, type) and "_cached" in vars(c)]:
        tables_on_device(cls)
    if callable(getattr(peer, "main", None)):
        peer.main()


if __name__ == "__main__":
    main()
