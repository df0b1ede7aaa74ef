#!/usr/bin/env bash
# Bazel --workspace_status_command (.bazelrc): stable keys for stamped targets.
# STABLE_RTP_FP8_REVISION is the commit, with -dirty when rtp_fp8/ or csrc/ has changes
# (the same rule as tools/wheel.py's source_revision).
rev=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [[ $rev != unknown && -n "$(git status --porcelain -- rtp_fp8 csrc 2>/dev/null)" ]]; then
  rev="$rev-dirty"
fi
echo "STABLE_RTP_FP8_REVISION $rev"
echo "STABLE_SOURCE_DATE_EPOCH $(git log -1 --format=%ct 2>/dev/null || echo 315532800)"
