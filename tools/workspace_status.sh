#!/usr/bin/env bash
# Bazel --workspace_status_command (.bazelrc): stable keys for stamped targets, from the code
# ./dev wheel runs (tools/wheel.py --workspace-status):
#   STABLE_RTP_FP8_VERSION_<toolchain>  the version of that toolchain's wheel: a release from a
#       clean tagged commit, else a dev version with the commit and, where the tree differs from
#       it anywhere, a digest of the difference; extension wheels add their CUDA label
#   STABLE_RTP_FP8_REVISION             the commit, -dirty under the same whole-tree rule
#   STABLE_SOURCE_DATE_EPOCH            the commit's time
python3 tools/wheel.py --workspace-status || {
  echo "STABLE_RTP_FP8_REVISION unknown"
  echo "STABLE_SOURCE_DATE_EPOCH 315532800"
}
