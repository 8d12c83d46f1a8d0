"""Releases in Spider's layout, written in code: SQLite databases under database/<db_id>/, tables.json, and the
question files of each split (train_spider.json, dev.json)."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

# Two small databases, as Spider splits them: training questions on one, held-out questions on the other.
SHOP = """
CREATE TABLE customer (id INTEGER PRIMARY KEY, name TEXT, city TEXT, age INTEGER);
CREATE TABLE purchase (id INTEGER PRIMARY KEY, customer_id INTEGER, amount REAL);
INSERT INTO customer VALUES (1, 'Ada', 'Berlin', 36), (2, 'Ben', 'Paris', 41), (3, 'Cleo', 'Berlin', 29);
INSERT INTO purchase VALUES (1, 1, 12.5), (2, 1, 3.0), (3, 2, 40.0), (4, 3, 7.25);
"""
PETS = """
CREATE TABLE pet (pet_id INTEGER PRIMARY KEY, kind TEXT, weight REAL, owner TEXT);
INSERT INTO pet VALUES (1, 'dog', 12.0, 'Ada'), (2, 'cat', 3.5, 'Ben'), (3, 'dog', 20.0, 'Cleo'),
    (4, 'fish', 0.1, 'Ada');
"""
SHOP_QUESTIONS = [
    ("How many customers are there?", "SELECT count(*) FROM customer"),
    ("Which customers live in Berlin?", "SELECT name FROM customer WHERE city = 'Berlin'"),
    ("What is the oldest customer's name?", "SELECT name FROM customer ORDER BY age DESC LIMIT 1"),
    ("What is the total amount of all purchases?", "SELECT sum(amount) FROM purchase"),
    ("How many customers live in each city?", "SELECT city, count(*) FROM customer GROUP BY city"),
    (
        "What did each customer spend?",
        "SELECT T1.name, sum(T2.amount) FROM customer AS T1 JOIN purchase AS T2 ON T1.id = T2.customer_id "
        "GROUP BY T1.name",
    ),
]
PETS_QUESTIONS = [
    ("How many pets are there?", "SELECT count(*) FROM pet"),
    ("Which kinds of pet are there?", "SELECT DISTINCT kind FROM pet"),
    ("What is the heaviest pet's kind?", "SELECT kind FROM pet ORDER BY weight DESC LIMIT 1"),
    ("How many dogs are there?", "SELECT count(*) FROM pet WHERE kind = 'dog'"),
    ("Who owns more than one pet?", "SELECT owner FROM pet GROUP BY owner HAVING count(*) > 1"),
]


def write_sqlite(path: Path, script: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(path)) as con:
        con.executescript(script)
        con.commit()
    return path


def write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def write_spider_release(root: Path) -> Path:
    """A release with a train split on the shop database and a dev split on the pets database; returns `root`."""
    write_sqlite(root / "database" / "shop" / "shop.sqlite", SHOP)
    write_sqlite(root / "database" / "pets" / "pets.sqlite", PETS)
    write_json(root / "tables.json", [{"db_id": "shop"}, {"db_id": "pets"}])
    write_json(root / "train_spider.json", [{"db_id": "shop", "question": q, "query": s} for q, s in SHOP_QUESTIONS])
    write_json(root / "dev.json", [{"db_id": "pets", "question": q, "query": s} for q, s in PETS_QUESTIONS])
    return root
