"""Which benchmark prompts tune the CLI's defaults and which are held out for reporting them.

``bench/defaults.py`` chooses the default strategies (``DEFAULT_STRATEGY``, ``DEFAULT_SAMPLED_STRATEGY``) by
comparing configurations on ``TUNING``. A speedup measured on the prompts that chose the winner overstates
what a new prompt gets, so the benchmarks that report the defaults (bench/peers.py, bench/serve.py,
bench/batch.py) read ``HELDOUT`` instead. Both splits have the same three workloads:

* ``chat``: the held-out chat prompts of ``spec_fast.drafts.prompts`` (never in the retrieval datastore or
  the drafts' training data). The first ``TUNING_CHAT_PROMPTS`` tune, the rest are held out.
* ``input-grounded``: a task over a document given in the prompt (summarise, extract, rewrite, answer from
  it, copy a part). Tuning has four tasks over one library passage; the held-out tasks read documents of
  other kinds (``DOCUMENTS``: code, an e-mail thread, a table, a contract ...), because how much of a reply
  a draft can copy from its prompt depends on the kind of text as much as on the task.
* ``long``: a document of some 600 tokens, then a question about it; the held-out one is a different
  document (``HELDOUT_LONG_DOCUMENT``).

Every held-out document here was written for this module. tests/drafts/test_bench_workloads.py checks that
no held-out prompt equals, contains or closely resembles a tuning prompt or a prompt whose answer fed the
retrieval datastore or the drafts' training.
"""

from __future__ import annotations

from spec_fast.drafts.prompts import HELDOUT_PROMPTS

__all__ = ["TUNING_CHAT_PROMPTS", "PASSAGE", "INPUT_GROUNDED", "LONG_DOCUMENT", "LONG", "DOCUMENTS",
           "INPUT_GROUNDED_TASKS", "HELDOUT_LONG_DOCUMENT", "HELDOUT_LONG_QUESTIONS", "TUNING", "HELDOUT"]

#: chat prompts that tune: bench/defaults.py's committed results read the first 4 (``--prompts 4``); the
#: first 8 count as tuning so that a rerun with more prompts still stays inside the split (defaults.py
#: refuses ``--prompts`` above this)
TUNING_CHAT_PROMPTS = 8

# --- tuning: the input-grounded and long workloads bench/defaults.py has always run -------------------------

PASSAGE = (
    "The city library opened a new branch in the old railway station last spring. The building had stood "
    "empty for twelve years after the last train left, and the council spent two years restoring the roof, "
    "the clock tower and the long waiting hall. The hall now holds the children's books, a reading room with "
    "forty seats and a small cafe run by volunteers. The ticket office became a room for local history, with "
    "maps, photographs of the station in the nineteen fifties and the timetable boards that once hung above "
    "the platforms. On weekdays the branch is open from nine in the morning until eight in the evening, and "
    "on Saturdays until five. It is closed on Sundays. In its first six months the branch lent more than "
    "thirty thousand books and registered four thousand new members, most of them families from the new "
    "houses near the river."
)
INPUT_GROUNDED = (
    f"Summarise this text in three sentences:\n\n{PASSAGE}",
    f"Rewrite this text in simpler words for a child:\n\n{PASSAGE}",
    f"List every number mentioned in this text, with what it counts:\n\n{PASSAGE}",
    f"Copy the first three sentences of this text exactly, then give it a title:\n\n{PASSAGE}",
)
LONG_DOCUMENT = "\n\n".join([PASSAGE] * 3 + [
    "Local residents had argued about the station for years. Some wanted flats, others a market hall, and a "
    "few wanted the trains back. The library plan won a public vote with sixty percent of the votes."
])
LONG = (
    f"{LONG_DOCUMENT}\n\nQuestion: when is the branch open? Answer from the text.",
    f"{LONG_DOCUMENT}\n\nQuestion: what did the council restore? Answer from the text.",
    f"{LONG_DOCUMENT}\n\nQuestion: how many books were lent in the first six months, and to whom?",
    f"{LONG_DOCUMENT}\n\nQuestion: what other uses were proposed for the station?",
)

TUNING: dict[str, tuple[str, ...]] = {
    "chat": tuple(HELDOUT_PROMPTS[:TUNING_CHAT_PROMPTS]),
    "input-grounded": INPUT_GROUNDED,
    "long": LONG,
}

# --- held out: documents of different kinds, 120-220 words each ---------------------------------------------

_NARRATIVE = """\
Marta Olsen had kept the island ferry running for nineteen years, and she could name most faults from the \
sound of the engine alone. On the first Tuesday of November the engine made a noise she had never heard: a \
dry clicking, like a pencil tapped on a desk, that came and went with the swell. The captain wanted to cancel \
the afternoon crossing. Forty passengers were waiting on the quay, among them a doctor who was needed at the \
island clinic and a choir of schoolchildren coming home from a competition. Marta asked for twenty minutes. \
She crawled behind the gearbox with a torch between her teeth and found a loose bolt on the cooling pump, \
knocking against its bracket each time the boat rolled. She tightened it, wrapped the bracket in a strip of \
rubber cut from an old boot, and listened again. The clicking had stopped. The ferry left thirty-five minutes \
late. When the children reached the island they sang their winning song on the deck, and the captain, who \
never praised anyone, bought Marta a new pair of boots."""

_PYTHON = '''\
import csv
from datetime import date


def load_readings(path):
    readings = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            day = date.fromisoformat(row["day"])
            readings.append((day, float(row["celsius"])))
    readings.sort()
    return readings


def rolling_mean(values, window):
    if window < 1:
        raise ValueError("window must be at least 1")
    means = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            means.append(total / window)
    return means


def warm_spells(readings, threshold, min_days=3):
    spells = []
    start = None
    for i, (day, celsius) in enumerate(readings):
        if celsius >= threshold and start is None:
            start = i
        elif celsius < threshold and start is not None:
            if i - start >= min_days:
                spells.append((readings[start][0], readings[i - 1][0]))
            start = None
    if start is not None and len(readings) - start >= min_days:
        spells.append((readings[start][0], readings[-1][0]))
    return spells'''

_EMAIL_THREAD = """\
From: Priya Nair
To: Tom Becker
Date: Thursday 14 March
Subject: Re: Re: Chair delivery for the second floor

Tom, next Thursday works for us. Please ask the drivers to use the loading bay on Mill Lane; the front \
entrance has a step and no lift. Someone from facilities will meet them at eight.
Priya

From: Tom Becker
To: Priya Nair
Date: Wednesday 13 March
Subject: Re: Chair delivery for the second floor

Hello Priya, our van broke down and we cannot deliver the thirty-two chairs on Friday as planned. We can \
bring them next Thursday morning between eight and ten, or on the Monday after. The six standing desks are \
still on back order until April. Sorry for the trouble.
Tom

From: Priya Nair
To: Tom Becker
Date: Monday 11 March
Subject: Chair delivery for the second floor

Hi Tom, just confirming our order for the second floor: thirty-two office chairs and six standing desks, \
delivered this Friday. Could you tell me the time window, and whether the drivers will carry everything \
upstairs?
Priya"""

_TABLE = """\
| Trail | Length (km) | Climb (m) | Typical time | Surface | Dogs allowed |
|---|---|---|---|---|---|
| Heron Lake loop | 6.5 | 40 | 1 h 30 min | gravel | yes |
| Old Quarry path | 9.2 | 310 | 3 h 10 min | rock and earth | yes |
| Beech Ridge | 12.8 | 540 | 4 h 45 min | earth | no |
| Millstream walk | 4.1 | 15 | 1 h | paved | yes |
| Falcon Crag | 7.4 | 620 | 3 h 40 min | rock | no |
| Valley Orchard trail | 10.6 | 120 | 2 h 50 min | gravel and grass | yes |

Notes: the times assume a steady pace with short stops. Falcon Crag is closed from March to June while the \
falcons nest on the cliff. The Millstream walk is paved along its whole length and suits wheelchairs and \
pushchairs. On the Old Quarry path the last kilometre before the viewpoint is steep and loose after rain, so \
walkers with dogs should keep them on a lead there."""

_CONTRACT = """\
7. Payment and termination
7.1 The Customer shall pay the monthly fee of ninety-five pounds in advance on the first day of each month. \
A payment received more than ten days late incurs an administration charge of fifteen pounds.
7.2 On signing, the Customer shall pay a deposit equal to one month's fee. The Company shall return the \
deposit within twenty-one days after the end of this Agreement, less any unpaid fees and the reasonable cost \
of cleaning or repairing the Unit beyond normal wear.
7.3 Either party may end this Agreement by giving at least fourteen days' written notice. Notice sent by \
e-mail to the address on the first page counts as written notice.
7.4 If the fee remains unpaid for sixty days, the Company may, after sending two written reminders at least \
fourteen days apart, refuse the Customer access to the Unit and, after a further thirty days, sell its \
contents to recover the sum owed. Any money left after the debt and the reasonable costs of sale are paid \
shall be returned to the Customer.
7.5 The Customer shall not keep food, animals, fuel, or any dangerous or unlawful goods in the Unit."""

_RECIPE = """\
Red lentil and carrot soup (serves four)

Ingredients: 250 g red lentils, 3 carrots, 1 onion, 2 cloves of garlic, 1 teaspoon of ground cumin, 1 litre \
of vegetable stock, 1 tablespoon of olive oil, the juice of half a lemon, salt and pepper.

Method: Rinse the lentils in a sieve until the water runs clear. Peel and dice the onion and the carrots, and \
crush the garlic. Warm the oil in a large pan over a medium heat and soften the onion for five minutes, \
stirring now and then so that it does not brown. Add the garlic and cumin and cook for one more minute. Tip in \
the carrots, lentils and stock, bring to the boil, then lower the heat and simmer with the lid half on for \
twenty-five minutes, until the lentils have fallen apart. Blend until smooth, or leave it chunky if you \
prefer. Stir in the lemon juice, season to taste, and thin with a little hot water if it is too thick. The \
soup keeps for three days in the fridge and freezes well."""

_MINUTES = """\
Minutes of the Riverside Rowing Club committee meeting, 9 May
Present: Helen Achebe (chair), Sam Ortiz (treasurer), Lena Fischer (secretary), Joe Park (boats), \
Amira Haddad (juniors)
Apologies: Colin Reid

1. The minutes of the April meeting were approved without changes.
2. Treasurer's report: the club has 4,210 pounds in the bank. Membership fees are down by eight percent on \
last year, mainly because fewer students joined.
3. Boats: the coxless four needs a new rigger before the regatta. Joe has a quote of 640 pounds. The \
committee agreed to spend up to 700 pounds.
4. Juniors: twelve juniors have signed up for the summer course. Amira asked for two more volunteer coaches \
on Saturday mornings. Lena will put a notice in the newsletter.
5. Regatta on 22 June: Helen will apply for the river permit by the end of May. Sam will ask the bakery on \
Quay Street whether it would sell food on the day.
Actions: Joe to order the rigger; Lena to write the newsletter notice; Helen to apply for the permit by 31 \
May; Sam to contact the bakery.
Next meeting: 13 June, 7 pm, in the boathouse."""

_ABSTRACT = """\
Abstract. Flat roofs on single-storey houses absorb much of the summer sun and pass the heat to the rooms \
below. We measured the effect of a white reflective roof coating on indoor temperature in twenty-four \
identical terraced houses in a coastal town over two summers. In the first summer no roof was coated; in the \
second, twelve houses chosen at random received the coating and twelve served as controls. Sensors recorded \
the air temperature every ten minutes in the main bedroom and on the roof surface. On days above 28 degrees \
Celsius the coated roofs were on average 19 degrees cooler at the surface at midday, and the bedrooms of \
coated houses were 1.8 degrees cooler in the late afternoon than those of control houses (95 percent \
interval 1.2 to 2.4). The difference at night was smaller, 0.6 degrees. Residents of coated houses reported \
running electric fans on fewer days. The coating lost about a fifth of its reflectance over the summer as \
dust collected, which suggests that cleaning it once a year would keep most of the benefit. The study did not \
include houses with insulated roofs."""

_MANUAL = """\
Setting up your wireless doorbell (model DB-20)

1. Slide down the battery cover on the back of the bell button. Insert two AAA batteries, matching the plus \
signs, and close the cover.
2. Plug the chime unit into a wall socket inside the house, no more than 80 metres from the door in open \
space or 30 metres through walls.
3. To pair the button with the chime, hold down the volume key on the chime for five seconds until its light \
flashes blue. Then press the bell button once. The chime plays a short tune to confirm.
4. To change the tune, press the note key on the chime repeatedly until you hear the one you want. There are \
36 tunes.
5. The volume key steps through four levels, from silent to loud. At the silent level the light still \
flashes when someone rings.

Troubleshooting: if the chime does not ring, first check the batteries, then move the chime closer to the \
door and pair the two again. A metal door frame can cut the range by half. The batteries last about a year \
at twenty rings a day."""

_NEWS = """\
Bus timetable changes from next month

Passengers on the number 14 and 31 routes will see changes from the first of September, the regional \
transport company announced on Tuesday. The 14, which links the hospital to the central station, will run \
every ten minutes instead of every fifteen on weekdays between seven and ten in the morning, after \
complaints about crowded buses during the school run. In return, the late evening service on the 31 will end \
at half past ten rather than midnight, because on average fewer than five people rode each of the last three \
buses. The company said the change would save about 180,000 pounds a year, which will pay for the extra \
morning buses. Local councillor Ruth Mensah welcomed the faster morning service but said that night-shift \
staff at the distribution centre on the ring road rely on the late 31 and would now need a taxi home. A \
public meeting about the changes will be held at the town hall on 20 August at six in the evening, and the \
new timetables will be on the company's website from next week."""

#: the held-out input-grounded documents by kind (each 120-220 words, written for this module)
DOCUMENTS: dict[str, str] = {
    "narrative": _NARRATIVE,
    "python-code": _PYTHON,
    "email-thread": _EMAIL_THREAD,
    "markdown-table": _TABLE,
    "contract": _CONTRACT,
    "recipe": _RECIPE,
    "meeting-minutes": _MINUTES,
    "scientific-abstract": _ABSTRACT,
    "product-manual": _MANUAL,
    "news-article": _NEWS,
}

#: ``(document kind, task)``: each held-out input-grounded prompt is the task, a blank line, then the document
#: (the layout of the tuning prompts)
INPUT_GROUNDED_TASKS: tuple[tuple[str, str], ...] = (
    ("narrative", "Retell this story in the first person, as Marta, in about one hundred words:"),
    ("narrative", "Answer from the story: what was wrong with the engine, and how did Marta fix it?"),
    ("python-code", "Add a docstring to every function in this Python module and change nothing else:"),
    ("email-thread", "Extract from this e-mail thread the new delivery day, the time window, the items that "
                     "will arrive and the entrance to use, as a JSON object:"),
    ("markdown-table", "Using only this table, which trails allow dogs and take less than three hours? "
                       "Compare how much they climb:"),
    ("contract", "Rewrite this contract clause in plain English, as a short list of what the customer must do "
                 "and what the company may do:"),
    ("recipe", "Scale this recipe up to serve eight people and list every ingredient with its new quantity:"),
    ("meeting-minutes", "Make a table of the actions in these minutes with the columns person, task and "
                        "deadline (write none where no deadline is given):"),
    ("scientific-abstract", "Explain this abstract to a newspaper reader in two sentences, keeping the main "
                            "numbers:"),
    ("scientific-abstract", "Extract from this abstract the number of houses, the treatment, the main result "
                            "and one limitation, as JSON:"),
    ("product-manual", "Copy steps 2 and 3 of this manual word for word:"),
    ("news-article", "Turn this news article into a bullet list with one fact on each line:"),
)

# --- held out: a long document of a kind the tuning one is not ---------------------------------------------

HELDOUT_LONG_DOCUMENT = """\
Staff travel and expenses policy

1. Purpose and scope
This policy explains which costs of work travel the company pays back and how to claim them. It applies to \
all employees and to contractors whose contract says so. It does not cover moving house for a new job, which \
has its own policy.

2. Before you travel
Every trip that needs a night away, or that costs more than 150 pounds in total, must be approved in advance \
by your line manager. Request approval through the travel form at least ten working days before you leave, \
giving the purpose, the dates and an estimate of the cost. Trips abroad also need the approval of your \
department head and a check that your passport is valid for at least six months after the return date.

3. Getting there
Use the cheapest practical option. Standard class rail is the default for journeys within the country. First \
class is allowed only for journeys over three hours when the fare difference is less than thirty pounds, or \
when a medical condition makes it necessary. Flights within the country need a written reason, such as a \
journey time by rail of more than five hours. If you drive your own car, you can claim 45 pence per mile for \
the first 10,000 business miles in a tax year and 25 pence per mile after that; the journey from home to your \
usual workplace does not count. Parking and tolls can be claimed with receipts. Taxis are for short journeys \
when no public transport runs, when you carry heavy equipment, or between ten at night and six in the morning.

4. Where you stay
Book hotels through the company's booking service where possible. The limit for one night, breakfast \
included, is 160 pounds in London, 120 pounds in other large cities and 95 pounds elsewhere. If no room is \
available within the limit, ask your manager to approve the higher rate before booking and keep the e-mail \
with your claim. Staying with friends or family instead of a hotel earns a flat allowance of 25 pounds a \
night, to cover a gift or a meal for your hosts.

5. Meals and other costs
While travelling you can claim the actual cost of meals, with receipts, up to 10 pounds for breakfast when it \
is not included in the room, 15 pounds for lunch and 30 pounds for dinner. Alcohol is not refunded, except \
one drink with dinner when you are hosting a client. Other costs the company pays include work phone calls, \
internet access in hotels when you need it for work, and visa fees. The company never refunds fines, such as \
parking or speeding tickets, lost luggage that was not insured, personal entertainment such as films in the \
hotel room, or upgrades you chose for your own comfort.

6. Making a claim
Submit claims through the expenses system within thirty days of the end of the trip. Attach a clear photo or \
scan of each receipt; a bank statement alone is not accepted. Your line manager approves claims up to 1,000 \
pounds, and the finance team also checks claims above that amount. Approved claims are paid with the next \
monthly salary if they are approved by the twentieth of the month. Claims submitted after ninety days are \
paid only in exceptional circumstances, at the discretion of the finance director.

7. Company cards
Employees who travel more than six times a year can ask for a company card. Card spending follows the same \
limits, and every payment must be matched with a receipt in the expenses system within thirty days. Personal \
spending on the card, even if paid back, may lead to the card being withdrawn."""

HELDOUT_LONG_QUESTIONS = (
    "How much may an employee spend on one night in a London hotel, and what if every room costs more? "
    "Answer from the text.",
    "Which costs does the company never pay back? Answer from the text.",
    "By when must a claim be submitted, who approves it, and when is it paid?",
)

HELDOUT: dict[str, tuple[str, ...]] = {
    "chat": tuple(HELDOUT_PROMPTS[TUNING_CHAT_PROMPTS:]),
    "input-grounded": tuple(f"{task}\n\n{DOCUMENTS[kind]}" for kind, task in INPUT_GROUNDED_TASKS),
    "long": tuple(f"{HELDOUT_LONG_DOCUMENT}\n\nQuestion: {q}" for q in HELDOUT_LONG_QUESTIONS),
}
