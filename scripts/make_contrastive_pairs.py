"""Write builtin-pairs, the (query, positive) pairs of the contrastive task, into the package (run once, offline).

Each pair asks about a thing in a city with a quality ("is the hotel pool in lisbon clean?") and answers with
a review that says it in other words ("our stay in lisbon: the swimming pool at the hotel was spotless"). The
query and its positive share the city but word the thing and the quality differently, so a model must match
paraphrases, and a batch holds negatives that share the city, the thing or the quality: in-batch negatives of
every difficulty. Train and held-out pairs never share a (thing, quality, city) triple.

    python scripts/make_contrastive_pairs.py   # rewrites gradacc/training/sources/builtin_pairs.json
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "gradacc" / "training" / "sources" / "builtin_pairs.json"
SEED = 20261205
TRAIN_PAIRS, EVAL_PAIRS = 3000, 300

# (how a query names it, how a review names it)
THINGS = [("hotel pool", "swimming pool at the hotel"), ("hotel room", "bedroom we stayed in"),
          ("hotel breakfast", "morning buffet"), ("hotel staff", "people at the front desk"),
          ("pizza place", "pizzeria"), ("coffee shop", "cafe"), ("sushi bar", "japanese restaurant"),
          ("bakery", "bread shop"), ("burger joint", "hamburger diner"), ("steakhouse", "grill restaurant"),
          ("museum", "art collection"), ("city park", "public gardens"), ("beach", "seaside"),
          ("train station", "railway terminal"), ("airport", "air terminal"), ("bus service", "local buses"),
          ("bike rental", "bicycle hire"), ("car rental", "rental car agency"), ("gym", "fitness center"),
          ("public library", "reading rooms"), ("concert hall", "music venue"), ("cinema", "movie theater"),
          ("night club", "dance club"), ("wine bar", "tasting room"), ("food market", "covered market"),
          ("bookshop", "book store"), ("dentist", "dental clinic"), ("hospital", "medical center"),
          ("hostel", "backpacker lodge"), ("campsite", "camping ground"), ("zoo", "animal park"),
          ("aquarium", "sea life center"), ("ski resort", "ski slopes"), ("spa", "wellness center"),
          ("old town", "historic quarter"), ("harbour", "port area"), ("ice cream shop", "gelato stand"),
          ("vegan restaurant", "plant based kitchen"), ("taxi service", "cab drivers"), ("ferry", "boat crossing")]

QUALITIES = [("clean", "spotless"), ("dirty", "filthy"), ("cheap", "inexpensive"), ("expensive", "overpriced"),
             ("crowded", "packed with people"), ("quiet", "peaceful"), ("noisy", "loud"), ("friendly", "welcoming"),
             ("rude", "unfriendly"), ("fast", "quick"), ("slow", "sluggish"), ("modern", "recently renovated"),
             ("old fashioned", "dated"), ("safe", "secure"), ("beautiful", "gorgeous"), ("ugly", "unattractive"),
             ("open late", "open until midnight"), ("good for kids", "great for children"),
             ("accessible by wheelchair", "step free"), ("worth a visit", "worth the trip"),
             ("hard to find", "badly signposted"), ("spacious", "roomy"), ("cramped", "tight on space"),
             ("pet friendly", "welcoming to dogs")]

CITIES = """lisbon porto madrid seville paris lyon berlin munich vienna prague rome milan naples athens oslo
stockholm helsinki dublin edinburgh krakow budapest zagreb tallinn riga""".split()

QUERIES = ["is the {thing} in {city} {quality}?", "{thing} {city} {quality}", "which {thing} in {city} is {quality}",
           "looking for a {quality} {thing} in {city}", "{city}: is the {thing} {quality}?",
           "reviews of the {thing} in {city}, {quality}?"]
POSITIVES = ["our stay in {city}: the {thing} was {quality}.", "in {city} we found the {thing} {quality}.",
             "the {thing} in {city} is {quality}, we thought.", "{city} trip report. {thing}: {quality}.",
             "we visited {city} last month and the {thing} was {quality}.",
             "honestly, the {thing} we tried in {city} felt {quality}."]


def main() -> None:
    rng = random.Random(SEED)
    triples = [(t, q, c) for t in range(len(THINGS)) for q in range(len(QUALITIES)) for c in range(len(CITIES))]
    rng.shuffle(triples)
    pairs = []
    for thing, quality, city in triples[:TRAIN_PAIRS + EVAL_PAIRS]:
        (query_thing, doc_thing), (query_quality, doc_quality) = THINGS[thing], QUALITIES[quality]
        pairs.append({"query": rng.choice(QUERIES).format(thing=query_thing, quality=query_quality, city=CITIES[city]),
                      "positive": rng.choice(POSITIVES).format(thing=doc_thing, quality=doc_quality,
                                                               city=CITIES[city])})
    data = {"about": "gradacc builtin-pairs: (query, positive) pairs for the contrastive task, made by "
                     "scripts/make_contrastive_pairs.py; train and eval share no (thing, quality, city).",
            "train": pairs[:TRAIN_PAIRS], "eval": pairs[TRAIN_PAIRS:]}
    OUT.write_text(json.dumps(data, indent=0, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{OUT}: {TRAIN_PAIRS} train and {EVAL_PAIRS} eval pairs, {OUT.stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
