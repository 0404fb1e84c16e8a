#!/bin/sh
# Entrypoint of the distseq image.
#   docker run IMG demo                                    -> distseq demo
#   docker run IMG torchrun --nproc_per_node=8 -m distseq train cfg.yaml
#                                                          -> torchrun --nproc_per_node=8 ...
#   docker run IMG distseq demo                            -> distseq demo
#   docker run IMG python ... | bash | sh                  -> run as is (debugging)
set -eu

if [ "$#" -eq 0 ]; then
    set -- --help
fi

case "$1" in
    torchrun)
        shift
        exec torchrun "$@"
        ;;
    distseq)
        shift
        exec distseq "$@"
        ;;
    python | python3 | bash | sh)
        exec "$@"
        ;;
    *)
        exec distseq "$@"
        ;;
esac
