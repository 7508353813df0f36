"""Allocate (and touch) 1 GiB, in 64 MiB steps, under a 256 MiB limit."""
print("starting", flush=True)
blocks = []
for i in range(16):
    blocks.append(bytearray(64 * 1024 * 1024))  # zero-filled, so every page is touched
    print(f"{(i + 1) * 64} MiB", flush=True)
print("allocated", flush=True)
