"""Reference implementations, transcribed from the public evaluation code they name.

These are THE REFERENCES the conformance corpora are scored with: kept as close to the
original code as Python 3 allows (quirks included), never imported by rsieve itself.
Each function names the file it was transcribed from.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

# --- the card (its snippets, quoted in docs/verifiers.md): levenshtein and alnum ---------


def card_levenshtein(a: str, b: str) -> int:
    """The card's levenshtein, as written there (docs/verifiers.md quotes it)."""
    if a == b:
        return 0
    if not a:
        return len(b)
    if not b:
        return len(a)
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
        prev = cur
    return prev[len(b)]


def card_alnum_norm(x: str) -> str:
    return re.sub(r"[^a-z0-9]", "", (x or "").lower())


def card_alnum(prediction: str, references: Sequence[str]) -> float:
    """The card's alnum_pair (docs/verifiers.md, `alnum`), best over the references."""
    return max(
        (1.0 if card_alnum_norm(prediction) == card_alnum_norm(g) else 0.0 for g in references),
        default=0.0,
    )


# --- lmms-eval lmms_eval/api/metrics.py: anls (from Qwen-VL infographicsvqa_eval.py) ------


def lmms_levenshtein_distance(s1: str, s2: str) -> int:
    if len(s1) > len(s2):
        s1, s2 = s2, s1
    distances: Sequence[int] = range(len(s1) + 1)
    for i2, c2 in enumerate(s2):
        distances_ = [i2 + 1]
        for i1, c1 in enumerate(s1):
            if c1 == c2:
                distances_.append(distances[i1])
            else:
                distances_.append(1 + min((distances[i1], distances[i1 + 1], distances_[-1])))
        distances = distances_
    return distances[-1]


def lmms_anls(
    references: Sequence[str], predictions: Sequence[str], thresh_hold: float = 0.5
) -> float:
    values = []
    for answer in references:
        gt_answer = " ".join(answer.strip().lower().split())
        det_answer = " ".join(predictions[0].strip().lower().split())
        dist = lmms_levenshtein_distance(gt_answer, det_answer)
        length = max(len(answer.upper()), len(predictions[0].upper()))
        values.append(0.0 if length == 0 else float(dist) / float(length))
    question_result = 1 - min(values)
    if question_result < thresh_hold:
        question_result = 0
    return question_result


# --- lmms-eval lmms_eval/tasks/chartqa/utils.py: relaxed_correctness ---------------------


def lmms_relaxed_correctness(
    prediction: str, target: str, max_relative_change: float = 0.05
) -> bool:
    def _to_float(text: str) -> float | None:
        try:
            if text.endswith("%"):
                return float(text.rstrip("%")) / 100.0
            else:
                return float(text)
        except ValueError:
            return None

    prediction_float = _to_float(prediction)
    target_float = _to_float(target)
    if prediction_float is not None and target_float:
        relative_change = abs(prediction_float - target_float) / abs(target_float)
        return relative_change <= max_relative_change
    else:
        return prediction.lower() == target.lower()


def lmms_relaxed(prediction: str, references: Sequence[str]) -> float:
    """chartqa_process_results scores one target; several references take the best."""
    return max(
        (1.0 if lmms_relaxed_correctness(prediction, t) else 0.0 for t in references), default=0.0
    )


# --- GT-Vision-Lab/VQA PythonEvaluationTools/vqaEvaluation/vqaEval.py ---------------------


class OfficialVQAEval:
    """VQAEval's normalisation and per-question accuracy, Python 3 (print removed)."""

    def __init__(self) -> None:
        self.contractions = {
            "aint": "ain't",
            "arent": "aren't",
            "cant": "can't",
            "couldve": "could've",
            "couldnt": "couldn't",
            "couldn'tve": "couldn't've",
            "couldnt've": "couldn't've",
            "didnt": "didn't",
            "doesnt": "doesn't",
            "dont": "don't",
            "hadnt": "hadn't",
            "hadnt've": "hadn't've",
            "hadn'tve": "hadn't've",
            "hasnt": "hasn't",
            "havent": "haven't",
            "hed": "he'd",
            "hed've": "he'd've",
            "he'dve": "he'd've",
            "hes": "he's",
            "howd": "how'd",
            "howll": "how'll",
            "hows": "how's",
            "Id've": "I'd've",
            "I'dve": "I'd've",
            "Im": "I'm",
            "Ive": "I've",
            "isnt": "isn't",
            "itd": "it'd",
            "itd've": "it'd've",
            "it'dve": "it'd've",
            "itll": "it'll",
            "let's": "let's",
            "maam": "ma'am",
            "mightnt": "mightn't",
            "mightnt've": "mightn't've",
            "mightn'tve": "mightn't've",
            "mightve": "might've",
            "mustnt": "mustn't",
            "mustve": "must've",
            "neednt": "needn't",
            "notve": "not've",
            "oclock": "o'clock",
            "oughtnt": "oughtn't",
            "ow's'at": "'ow's'at",
            "'ows'at": "'ow's'at",
            "'ow'sat": "'ow's'at",
            "shant": "shan't",
            "shed've": "she'd've",
            "she'dve": "she'd've",
            "she's": "she's",
            "shouldve": "should've",
            "shouldnt": "shouldn't",
            "shouldnt've": "shouldn't've",
            "shouldn'tve": "shouldn't've",
            "somebody'd": "somebodyd",
            "somebodyd've": "somebody'd've",
            "somebody'dve": "somebody'd've",
            "somebodyll": "somebody'll",
            "somebodys": "somebody's",
            "someoned": "someone'd",
            "someoned've": "someone'd've",
            "someone'dve": "someone'd've",
            "someonell": "someone'll",
            "someones": "someone's",
            "somethingd": "something'd",
            "somethingd've": "something'd've",
            "something'dve": "something'd've",
            "somethingll": "something'll",
            "thats": "that's",
            "thered": "there'd",
            "thered've": "there'd've",
            "there'dve": "there'd've",
            "therere": "there're",
            "theres": "there's",
            "theyd": "they'd",
            "theyd've": "they'd've",
            "they'dve": "they'd've",
            "theyll": "they'll",
            "theyre": "they're",
            "theyve": "they've",
            "twas": "'twas",
            "wasnt": "wasn't",
            "wed've": "we'd've",
            "we'dve": "we'd've",
            "weve": "we've",
            "werent": "weren't",
            "whatll": "what'll",
            "whatre": "what're",
            "whats": "what's",
            "whatve": "what've",
            "whens": "when's",
            "whered": "where'd",
            "wheres": "where's",
            "whereve": "where've",
            "whod": "who'd",
            "whod've": "who'd've",
            "who'dve": "who'd've",
            "wholl": "who'll",
            "whos": "who's",
            "whove": "who've",
            "whyll": "why'll",
            "whyre": "why're",
            "whys": "why's",
            "wont": "won't",
            "wouldve": "would've",
            "wouldnt": "wouldn't",
            "wouldnt've": "wouldn't've",
            "wouldn'tve": "wouldn't've",
            "yall": "y'all",
            "yall'll": "y'all'll",
            "y'allll": "y'all'll",
            "yall'd've": "y'all'd've",
            "y'alld've": "y'all'd've",
            "y'all'dve": "y'all'd've",
            "youd": "you'd",
            "youd've": "you'd've",
            "you'dve": "you'd've",
            "youll": "you'll",
            "youre": "you're",
            "youve": "you've",
        }
        self.manualMap = {
            "none": "0",
            "zero": "0",
            "one": "1",
            "two": "2",
            "three": "3",
            "four": "4",
            "five": "5",
            "six": "6",
            "seven": "7",
            "eight": "8",
            "nine": "9",
            "ten": "10",
        }
        self.articles = ["a", "an", "the"]
        self.periodStrip = re.compile(r"(?!<=\d)(\.)(?!\d)")
        self.commaStrip = re.compile(r"(\d)(\,)(\d)")
        self.punct = [
            ";",
            r"/",
            "[",
            "]",
            '"',
            "{",
            "}",
            "(",
            ")",
            "=",
            "+",
            "\\",
            "_",
            "-",
            ">",
            "<",
            "@",
            "`",
            ",",
            "?",
            "!",
        ]

    def processPunctuation(self, inText: str) -> str:
        outText = inText
        for p in self.punct:
            if (p + " " in inText or " " + p in inText) or (
                re.search(self.commaStrip, inText) is not None
            ):
                outText = outText.replace(p, "")
            else:
                outText = outText.replace(p, " ")
        outText = self.periodStrip.sub("", outText, re.UNICODE)
        return outText

    def processDigitArticle(self, inText: str) -> str:
        outText = []
        tempText = inText.lower().split()
        for word in tempText:
            word = self.manualMap.setdefault(word, word)
            if word not in self.articles:
                outText.append(word)
        for wordId, word in enumerate(outText):
            if word in self.contractions:
                outText[wordId] = self.contractions[word]
        return " ".join(outText)

    def question_accuracy(self, res_answer: str, answers: Sequence[str]) -> float:
        """evaluate()'s body for one question; answers carry answer_id as in the json."""
        gts: dict[str, list[dict[str, Any]]] = {
            "answers": [{"answer": a, "answer_id": i + 1} for i, a in enumerate(answers)]
        }
        gts = copy.deepcopy(gts)
        resAns = res_answer
        resAns = resAns.replace("\n", " ")
        resAns = resAns.replace("\t", " ")
        resAns = resAns.strip()
        resAns = self.processPunctuation(resAns)
        resAns = self.processDigitArticle(resAns)
        gtAcc = []
        gtAnswers = [ans["answer"] for ans in gts["answers"]]
        if len(set(gtAnswers)) > 1:
            for ansDic in gts["answers"]:
                ansDic["answer"] = self.processPunctuation(ansDic["answer"])
        for gtAnsDatum in gts["answers"]:
            otherGTAns = [item for item in gts["answers"] if item != gtAnsDatum]
            matchingAns = [item for item in otherGTAns if item["answer"] == resAns]
            acc = min(1, float(len(matchingAns)) / 3)
            gtAcc.append(acc)
        return float(sum(gtAcc)) / len(gtAcc)


def official_vqa(prediction: str, references: Sequence[str]) -> float:
    return OfficialVQAEval().question_accuracy(prediction, references)


# --- VLMEvalKit vlmeval/utils/matching_util.py: can_infer (VERBOSE unset) -----------------
# The long-standing form. One later revision also requires `splits.index(ch) <
# len(splits) - 5` before returning a letter (which rejects a bare "B"); not transcribed.


def vlmeval_can_infer_option(answer: str, choices: dict[str, str]) -> str | bool:
    verbose = 0
    if "Failed to obtain answer via API" in answer:
        return False
    reject_to_answer = [
        "Sorry, I can't help with images of people yet.",
        "I can't process this file.",
        "I'm sorry, but without the image provided",
        "Cannot determine the answer",
    ]
    for err in reject_to_answer:
        if err in answer:
            return "Z"

    def count_choice(splits: list[str], choices: object, prefix: str = "", suffix: str = "") -> int:
        cnt = 0
        for c in choices:  # type: ignore[attr-defined]
            if prefix + c + suffix in splits:
                cnt += 1
        return cnt

    answer_mod = copy.copy(answer)
    chars = ".()[],:;!*#{}"
    for c in chars:
        answer_mod = answer_mod.replace(c, " ")
    splits = [x.strip() for x in answer_mod.split()]
    count = count_choice(splits, choices)
    if count == 1:
        for ch in choices:
            if "A" in splits and len(splits) > 3 and verbose:
                return False
            if ch in splits:
                return ch
    elif count == 0 and count_choice(splits, {"Z", ""}) == 1:
        return "Z"
    return False


def vlmeval_can_infer_text(answer: str, choices: dict[str, str]) -> str | bool:
    answer = answer.lower()
    for k in choices:
        choices[k] = str(choices[k]).lower()
    cands = []
    for k in choices:
        if choices[k] in answer:
            cands.append(k)
    if len(cands) == 1:
        return cands[0]
    return False


def vlmeval_can_infer(answer: str, choices: dict[str, str]) -> str | bool:
    answer = str(answer)
    choices = dict(choices)
    copt = vlmeval_can_infer_option(answer, choices)
    return copt if copt else vlmeval_can_infer_text(answer, choices)


def vlmeval_mc(prediction: str, references: Sequence[str], options: dict[str, str]) -> float:
    letter = vlmeval_can_infer(prediction, options)
    return 1.0 if letter and any(letter == r for r in references) else 0.0


# --- Math-Verify (huggingface/Math-Verify README usage; gold parsed first) ----------------


def math_verify_reference(prediction: str, references: Sequence[str]) -> float:
    """README: gold = parse("${gold}$"); answer = parse(answer); verify(gold, answer)."""
    from math_verify import parse, verify

    answer = parse(prediction, parsing_timeout=None)
    for ref in references:
        gold = parse(ref if "$" in ref else f"${ref}$", parsing_timeout=None)
        if verify(gold, answer, timeout_seconds=None):
            return 1.0
    return 0.0
