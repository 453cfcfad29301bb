"""The built-in dataset: short product and venue reviews, labelled negative (0) or positive (1).

Generated, so it works offline and is the same for the same seed. Varied enough (dozens of subjects,
openers, intensifiers, negations and sentiment-bearing closers) that a WordPiece tokenizer learns a real
vocabulary and a tiny transformer has something to learn, yet clean enough to reach F1 > 0.9 in seconds.
"""

from __future__ import annotations

import random
from pathlib import Path

LABEL_NAMES = ["negative", "positive"]
# builtin-pairs, the contrastive task's (query, positive) pairs: generated once by
# scripts/make_contrastive_pairs.py and shipped (train and held-out pairs).
PAIRS_FILE = Path(__file__).with_name("builtin_pairs.json")

SUBJECTS = """movie film plot ending soundtrack acting director sequel documentary series episode
restaurant meal pizza pasta burger salad soup coffee dessert breakfast waiter staff kitchen menu
hotel room bed shower view pool lobby receptionist breakfast buffet location neighbourhood
book novel chapter author story translation cover poem
phone battery screen camera charger keyboard laptop tablet headset speaker printer router update app
concert band singer album song festival show theatre musical lecture course teacher workshop
flight airline seat train bus driver ticket museum gallery park beach trail bike car engine
game controller level graphics multiplayer tutorial shop delivery package price warranty""".split()

POSITIVE = """great excellent wonderful delightful superb fantastic brilliant lovely charming amazing solid
reliable friendly helpful fresh tasty comfortable clean smooth impressive enjoyable memorable pleasant
outstanding beautiful perfect fun clever generous cozy gorgeous thoughtful flawless stunning
refreshing elegant affordable spacious quiet fast responsive crisp vibrant heartwarming""".split()

NEGATIVE = """terrible awful boring dull disappointing horrible bland rude slow dirty broken buggy noisy
cheap poor mediocre painful annoying confusing overpriced stale cold cramped forgettable sloppy clumsy
useless weak ugly frustrating unreliable greasy soggy laggy flimsy tedious pointless shabby
unpleasant dreadful faulty sticky smelly expensive""".split()

INTENSIFIERS = ["", "", "very", "really", "quite", "truly", "incredibly", "rather", "so", "pretty",
                "absolutely", "surprisingly", "genuinely", "a bit", "extremely"]

OPENERS = ["", "", "", "honestly", "overall", "to be fair", "i think", "my friend said", "after two weeks",
           "on our last visit", "for what it is worth", "in my opinion", "as expected", "believe it or not",
           "we all agreed", "my sister thinks", "the reviews were right", "last night"]

LINKS = ["was", "is", "felt", "seemed", "looked", "turned out", "was just", "has been", "remains"]

CLOSERS = {
    1: ["i would recommend it", "we will come back", "worth every penny", "five stars", "loved it",
        "a real pleasure", "highly recommended", "i am impressed", "better than expected"],
    0: ["never again", "what a waste", "avoid it", "one star", "i want a refund", "not worth it",
        "a real letdown", "i regret it", "worse than expected"],
    None: ["", "", "", "", "for the price", "on a tuesday", "with my family", "this time", "in the end",
           "at least for me", "if you ask me", "as usual"],
}


def review(label: int, rng: random.Random) -> str:
    """One review whose sentiment is ``label``; some say it through a negated opposite word."""
    subject = rng.choice(SUBJECTS)
    negated = rng.random() < 0.12
    # A negated sentence uses a word of the opposite polarity: "not great" is negative.
    words = (NEGATIVE if label == 1 else POSITIVE) if negated else (POSITIVE if label == 1 else NEGATIVE)
    adjective = rng.choice(words)
    intensity = "" if negated else rng.choice(INTENSIFIERS)
    parts = [rng.choice(OPENERS), "the", subject, rng.choice(LINKS), "not" if negated else "", intensity, adjective]
    roll = rng.random()
    closer = rng.choice(CLOSERS[label]) if roll < 0.3 else rng.choice(CLOSERS[None])
    text = " ".join(p for p in parts if p)
    return f"{text}, {closer}" if closer else text


def make_sentiment(num_examples: int, seed: int) -> tuple[list[str], list[int]]:
    """Balanced (alternating, then shuffled) texts and labels for a seed."""
    rng = random.Random(seed)
    labels = [i % 2 for i in range(num_examples)]
    rng.shuffle(labels)
    return [review(label, rng) for label in labels], labels


def tokenizer_corpus(num_sentences: int = 6000) -> list[str]:
    """A fixed corpus (independent of the run's seed) so one trained tokenizer serves every run."""
    texts, _ = make_sentiment(num_sentences, seed=20240601)
    return texts


# ---- builtin-text: the causal-LM dataset ------------------------------------------------------------
# Reviews of one to a dozen sentences, all of one mood: a few tokens ("five stars.") up to past any
# sensible sequence length. Lengths this uneven are what makes "each micro-batch's mean ÷ k" wrong for a
# token-level loss. Generated from the lists above, so it is offline and the same for the same seed, and
# regular enough that a tiny GPT's eval loss falls clearly within seconds.

FOLLOW_UPS = {
    1: ["the staff were {pos} and the {subject} was {pos}", "we liked the {subject} a lot",
        "even the {subject} was {pos}", "my {relative} loved the {subject} too", "the {subject} is worth it",
        "next time we will try the {subject}", "it was {intensity} {pos} from start to finish"],
    0: ["the staff were {neg} and the {subject} was {neg}", "nobody liked the {subject}",
        "even the {subject} was {neg}", "my {relative} hated the {subject} too", "the {subject} is not worth it",
        "next time we will skip the {subject}", "it was {intensity} {neg} from start to finish"],
}
RELATIVES = ["sister", "brother", "friend", "mother", "father", "partner", "colleague", "neighbour"]


def document(label: int, rng: random.Random) -> str:
    """One review: sentence count skewed short, a long tail of many sentences."""
    sentences = min(12, 1 + int(rng.expovariate(1 / 2.2)))
    if rng.random() < 0.15:
        return rng.choice(CLOSERS[label]) + "."
    parts = [review(label, rng)]
    for _ in range(sentences - 1):
        if rng.random() < 0.5:
            parts.append(review(label, rng))
        else:
            parts.append(rng.choice(FOLLOW_UPS[label]).format(
                pos=rng.choice(POSITIVE), neg=rng.choice(NEGATIVE), subject=rng.choice(SUBJECTS),
                relative=rng.choice(RELATIVES), intensity=rng.choice(INTENSIFIERS[2:])))
    return " ".join(sentence[0].upper() + sentence[1:] + "." for sentence in parts)


def make_text(num_documents: int, seed: int) -> list[str]:
    """``num_documents`` reviews for a seed (half of each mood)."""
    rng = random.Random(seed)
    labels = [i % 2 for i in range(num_documents)]
    rng.shuffle(labels)
    return [document(label, rng) for label in labels]


def text_tokenizer_corpus(num_documents: int = 4000) -> list[str]:
    """A fixed corpus (independent of the run's seed) for tiny-gpt's byte-level BPE."""
    return make_text(num_documents, seed=20240602)
