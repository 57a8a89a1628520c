# An unmodified torchelastic-style script: @record writes TORCHELASTIC_ERROR_FILE when it raises.
import os

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("rank 1 found a bad batch")


if __name__ == "__main__":
    main()
