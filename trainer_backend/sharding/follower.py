"""A follower process of a sharded backend: `python -m trainer_backend.sharding.follower`, started by the leader
(`group.start_followers`) or by torchrun, its place in the group from torchrun's variables."""

from __future__ import annotations

import argparse
import logging
import sys

from trainer_backend.sharding.group import LeaderGoneError, ShardPlace
from trainer_backend.sharding.replica import follow
from trainer_backend.sharding.shards import EngineSettings, sharded_engine

log = logging.getLogger("trainer_backend.sharding.follower")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    EngineSettings.add_arguments(parser)
    settings = EngineSettings.from_arguments(parser.parse_args(argv))
    place = ShardPlace.from_environment()
    if place is None or place.leads:
        parser.error("a follower needs RANK (1 or more), WORLD_SIZE, MASTER_ADDR and MASTER_PORT in its environment")
    layout = f"%(asctime)s shard {place.rank} %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.INFO, format=layout)
    return run_follower(settings, place)


def run_follower(settings: EngineSettings, place: ShardPlace) -> int:
    """Build this process's engine over its shard and make the leader's calls until it stops; the exit status."""
    group, engine = sharded_engine(settings, place)
    try:
        follow(engine, group.channel)
    except LeaderGoneError as error:
        log.error("%s; this follower stops", error)
        return 1
    finally:
        group.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
