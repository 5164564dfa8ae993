"""What a device bundle states and ships besides the binaries: the I/O contract (dist_contract), split graphs'
parts and weight-shared contexts (dist_parts). The root's dist.py makes and verifies bundles with them.

May import: everything below it (... toolchains, emulator).
"""
