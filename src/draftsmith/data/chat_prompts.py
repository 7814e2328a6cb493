"""Built-in chat prompts: what a user asks a general assistant, for targets that answer them themselves.

A drafter is trained on the target's own answers (`draftsmith data regenerate`), so all a quickstart needs is
prompts. These are written here from templates and subjects, in eight categories (explain, how-to, writing,
lists, compare, math, coding, advice), so every machine has them with no dataset at hand:

    prompts:train     the prompts on training subjects (891)
    prompts:heldout   the prompts on held-out subjects, for evaluation (134)

A subject (a concept, a task, a pair of things...) is held out by a stable hash of its text, so no held-out
prompt shares its subject with a training prompt; they share the templates, as real traffic does. Math word
problems draw their names and numbers from a seeded generator, one subject per problem. Records are `turns`
rows with a `category` field; the order is a fixed shuffle, so the first N are a mixed sample.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Literal

Split = Literal["train", "heldout", "all"]
HELDOUT_PERCENT = 14  # subjects whose sha1 bucket (0-99) is below this are held out
SOURCES: dict[str, Split] = {"prompts": "all", "prompts:train": "train", "prompts:heldout": "heldout"}


def _subjects(text: str) -> list[str]:
    """The `;`-separated subjects of `text`, each on one line."""
    return [" ".join(s.split()) for s in text.split(";")]


CONCEPTS = _subjects(
    """photosynthesis; inflation; gravity; the water cycle; machine learning; compound interest; vaccines;
plate tectonics; the French Revolution; supply and demand; black holes; DNA; electricity; climate change; the
immune system; democracy; blockchain; how the internet works; evolution; the stock market; antibiotics;
recycling; nuclear energy; the Renaissance; the scientific method; opportunity cost; the greenhouse effect;
neural networks; the Pythagorean theorem; probability; the Industrial Revolution; cloud computing; encryption;
the placebo effect; habit formation; the theory of relativity; volcanoes; ocean tides; the Roman Empire;
cryptocurrency; solar power; the human heart; sleep; memory; inflation targeting by central banks; taxes;
the printing press; rainbows; earthquakes; the moon's phases; a recursive function; an operating system;
a database index; version control; the Cold War; the Silk Road; viruses and bacteria; metabolism; the ozone
layer; the electoral college; a budget deficit; renewable energy; artificial intelligence; quantum computing;
the speed of light; fermentation; batteries; magnetism; the food chain; the Big Bang"""
)

TASKS = _subjects(
    """bake a loaf of bread; change a flat tire; start running as a beginner; learn a new language; write a
resume; save money on groceries; plant tomatoes; prepare for a job interview; make a cup of pour-over coffee;
clean a laptop keyboard; set up a home network; study for an exam; train a puppy to sit; paint a room; make a
simple budget; start a vegetable garden; improve my handwriting; back up my photos; learn to play the guitar;
cook rice on the stove; fix a leaking faucet; write a cover letter; organize a small closet; reduce screen
time; plan a birthday party; make homemade pizza dough; learn to touch type; start a podcast; write a good
email subject line; prepare for a marathon; take better photos with a phone; memorize a speech; care for a
houseplant; negotiate a salary; make a smoothie; pack for a week-long trip; read more books; start journaling;
meditate for the first time; sharpen a kitchen knife"""
)

WRITING = _subjects(
    """the ocean at night; a lost cat finding its way home; the first day of spring; a city in the rain;
an old lighthouse keeper; a robot learning to paint; friendship; a forgotten library; a mountain village; the
last day of summer; a dragon who is afraid of fire; a train journey; autumn leaves; a child's first snowfall;
a busy kitchen; a time traveler stuck in the past; a garden at dawn; a quiet Sunday morning; the stars; a
small bakery; a grandfather's watch; a message in a bottle; a storm at sea; learning to ride a bike"""
)

THINGS = _subjects(
    """healthy breakfast foods; famous scientists; programming languages; tips for better sleep; ways to
reduce stress; countries in South America; benefits of exercise; classic novels; renewable energy sources;
houseplants that are easy to care for; board games for families; ways to save energy at home; common
job interview questions; mammals that live in the ocean; inventions of the twentieth century; hobbies to
try this year; ways to be more productive; things to do on a rainy day; vegetables that grow quickly;
habits of successful students; planets in the solar system; musical instruments; European capitals; uses
of artificial intelligence"""
)

PAIRS = _subjects(
    """a virus and a bacterium; weather and climate; a list and a tuple in Python; stocks and bonds; speed
and velocity; a crocodile and an alligator; RAM and storage; a democracy and a republic; baking soda and
baking powder; an asteroid and a comet; a simile and a metaphor; mitosis and meiosis; TCP and UDP; a debit
card and a credit card; affect and effect; a lake and a pond; an LLC and a corporation; HTML and CSS;
weight and mass; a hurricane and a tornado; machine learning and deep learning; a star and a planet; empathy
and sympathy; an epidemic and a pandemic; renting and buying a home; tea and coffee"""
)

CODING = _subjects(
    """reverses a string; checks whether a number is prime; returns the n-th Fibonacci number; counts the
vowels in a string; removes duplicates from a list while keeping the order; finds the largest number in a
list; checks whether a word is a palindrome; merges two sorted lists; computes the factorial of a number;
converts Celsius to Fahrenheit; flattens a nested list; counts how often each word appears in a text; sorts a
list of dictionaries by a key; checks whether two strings are anagrams; returns the sum of the digits of a
number; finds the second largest number in a list; capitalizes the first letter of every word; computes the
average of a list of numbers; checks whether a year is a leap year; returns the greatest common divisor of
two numbers; splits a list into chunks of size n; validates an email address with a regular expression;
reads a CSV file and returns its rows; implements binary search"""
)

GOALS = _subjects(
    """staying focused while working from home; making new friends in a new city; eating healthier on a
budget; keeping a conversation going; staying motivated to exercise; managing a busy schedule; giving a good
presentation; getting better sleep; learning to code; writing clearly; traveling on a budget; being a good
listener; dealing with procrastination; keeping a tidy home; preparing for a long flight; starting a small
business; teaching a child to read; staying calm before an exam; working in a team; saving for
retirement"""
)

TEMPLATES: dict[str, tuple[list[str], list[str]]] = {
    "explain": (
        CONCEPTS,
        [
            "Explain {} in simple terms.",
            "What is {}, and why does it matter?",
            "Can you give a short explanation of {} for a high school student?",
            "Describe {} in three or four sentences.",
        ],
    ),
    "how-to": (
        TASKS,
        [
            "How do I {}?",
            "Give me step-by-step instructions to {}.",
            "What is the easiest way to {}?",
        ],
    ),
    "writing": (
        WRITING,
        [
            "Write a short poem about {}.",
            "Write a short story about {}.",
            "Write a haiku about {}.",
            "Describe {} in a vivid paragraph.",
        ],
    ),
    "lists": (
        THINGS,
        [
            "List five {}.",
            "Name three {} and describe each in one sentence.",
            "What are some {}?",
        ],
    ),
    "compare": (
        PAIRS,
        [
            "What is the difference between {}?",
            "Compare {} in a few sentences.",
        ],
    ),
    "coding": (
        CODING,
        [
            "Write a Python function that {}.",
            "Show me a Python function that {}, with a short explanation.",
        ],
    ),
    "advice": (
        GOALS,
        [
            "What are some tips for {}?",
            "Give me advice on {}.",
        ],
    ),
}

NAMES = (
    "Anna Ben Carla David Emma Farid Grace Hugo Ines Jack Kira Liam Maya Noah Omar Priya Quinn Rosa Sam Tara"
)
MATH_TEMPLATES = [
    "{n} has {a} apples and buys {b} more. Then {n} gives away {c}. How many apples does {n} have now?",
    "A shop sells pencils for {a} cents each. {n} buys {b} pencils and pays with a {c} dollar bill. How much "
    "change does {n} get?",
    "{n} reads {a} pages every day. How many days does it take {n} to read a book of {t} pages?",
    "A train travels at {a} kilometers per hour for {b} hours. How far does it travel?",
    "{n} saves {a} dollars a week. How many weeks will it take to save {t} dollars?",
    "A rectangle is {a} meters long and {b} meters wide. What are its area and its perimeter?",
    "{n} had {t} stickers and shared them equally among {b} friends. How many stickers did each friend get, "
    "and how many were left over?",
    "A recipe needs {a} eggs for {b} people. How many eggs are needed for {c} people?",
]
MATH_PROBLEMS = 320  # word problems drawn from the seeded generator, for both splits (a repeat is kept once)


def _heldout(subject: str) -> bool:
    return int(hashlib.sha1(subject.encode()).hexdigest(), 16) % 100 < HELDOUT_PERCENT


def _math_problems() -> list[tuple[str, str]]:
    """(subject, prompt) for the word problems; the subject is the problem itself."""
    rng = random.Random(0)
    names = NAMES.split()
    out = []
    for _ in range(MATH_PROBLEMS):
        a, b, c = rng.randint(2, 40), rng.randint(2, 12), rng.randint(2, 20)
        text = rng.choice(MATH_TEMPLATES).format(
            n=rng.choice(names), a=a, b=b, c=c, t=a * b * rng.randint(2, 5)
        )
        out.append((text, text))
    return out


def chat_prompts(split: Split = "train") -> list[dict[str, Any]]:
    """The built-in prompts of `split` as `turns` records (`{"turns": [prompt], "category": ...}`).

    Args:
        split: "train", "heldout" or "all".

    Returns:
        The records in a fixed shuffled order (the same on every machine).
    """
    rows: list[tuple[str, str, str]] = []  # (category, subject, prompt)
    for category, (subjects, templates) in TEMPLATES.items():
        for subject in subjects:
            rows.extend((category, subject, t.format(subject)) for t in templates)
    rows.extend(("math", subject, text) for subject, text in _math_problems())
    if split != "all":
        rows = [r for r in rows if _heldout(r[1]) == (split == "heldout")]
    random.Random(f"chat-prompts-{split}").shuffle(rows)
    unique: dict[str, str] = {}  # prompt -> category; a math problem drawn twice is kept where it first came
    for category, _, prompt in rows:
        unique.setdefault(prompt, category)
    return [{"turns": [prompt], "category": category} for prompt, category in unique.items()]
