#!/usr/bin/env bash
# Installs braid into a scratch root and builds a program against it with pkg-config alone,
# as a user's project would (meson's dependency('braid') reads the same braid.pc).
#   install_test.sh BUILD_ROOT CONSUMER_SOURCE [TORCH_CONSUMER_SOURCE]
# With the third argument (braid built with libtorch), the same for braid-torch.pc.
set -euo pipefail
build_root=$1
consumer=$2
torch_consumer=${3:-}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

meson install -C "$build_root" --destdir "$scratch" --no-rebuild --quiet
pc=$(find "$scratch" -name braid.pc | head -n 1)
[ -n "$pc" ] || { echo "braid.pc was not installed"; exit 1; }
prefix=$(pkg-config --variable=prefix "$pc")
# Point the installed prefix at the scratch root; fmt and the other Requires stay as they are.
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --define-variable=prefix="$scratch$prefix" \
  --cflags --libs braid)
echo "pkg-config braid: $flags"
c++ "$consumer" $flags -o "$scratch/consumer"
libdir=$(dirname "$(find "$scratch" -name 'libbraid.so' | head -n 1)")
output=$(LD_LIBRARY_PATH="$libdir" BRAID_WORLD_SIZE=1 "$scratch/consumer")
echo "$output"
[ "$output" = "consumer: rank 0 of 1 got 42" ]

[ -n "$torch_consumer" ] || exit 0
[ -n "$(find "$scratch" -name braid-torch.pc)" ] || { echo "braid-torch.pc was not installed"; exit 1; }
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --define-variable=prefix="$scratch$prefix" \
  --cflags --libs braid-torch)
echo "pkg-config braid-torch: $flags"
c++ "$torch_consumer" $flags -o "$scratch/torch_consumer"
output=$(LD_LIBRARY_PATH="$libdir" "$scratch/torch_consumer")
echo "$output"
[ "$output" = "torch consumer: 6 f32" ]
