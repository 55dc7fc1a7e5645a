"""The cold set: conversations written for `specdec bench --peer vllm` and sent once each in a
server's life, so that no cache of earlier completions holds their answers. None of them comes
from the tuning or held-out sets (bench/heldout.py), the suite's prompts (bench/prompts.py) or
the distillation corpus. Kinds: chat questions, explanations, code, lists, rewriting and
summarising a given passage, and multi-turn chats (rendered through the model's chat template).
"""

from __future__ import annotations

QUESTION = (
    "What is the difference between a latte and a flat white?",
    "Why does bread go stale faster in the fridge than on the counter?",
    "How many hours of sleep does a teenager typically need?",
    "Is it cheaper to rent or buy a car if I only drive on weekends?",
    "What caused the fall of the Western Roman Empire?",
    "How do I know if my houseplant is getting too much water?",
    "What does a central bank do when it raises interest rates, and why does it do it?",
    "Can you tell me the rules of cricket in simple terms?",
    "Which planets in our solar system have rings?",
    "What is the best way to store fresh herbs so they last longer?",
    "How does a credit score get calculated in the United States?",
    "Why do cats knead blankets with their paws?",
    "What should I look for when buying a used bicycle?",
    "Is it safe to eat eggs a few days past their best-before date?",
    "What is the difference between a virus and a bacterium?",
    "How long does it take an adult to learn to play the guitar reasonably well?",
    "What are the main differences between Python lists and tuples?",
    "Why is the sky often red or orange at sunset?",
    "How do I politely decline a meeting invitation from my manager?",
    "What is a reasonable monthly budget for groceries for two adults?",
    "Who invented the printing press, and why did it matter so much?",
    "How often should I replace my running shoes?",
    "What is the difference between a will and a trust?",
    "Why do some people get seasick while others never do?",
    "What is the tallest mountain in Africa, and can beginners climb it?",
    "How do noise-cancelling headphones actually cancel noise?",
    "What is the difference between baking soda and baking powder?",
    "Should I pay off my student loan early or invest the money instead?",
    "How does a tie-break work in tennis?",
    "What time of year is best for visiting Japan?",
    "Why are prime numbers so important in cryptography?",
    "How can I tell if an email asking for my password is a phishing attempt?",
    "What is a minor key in music, and why does it often sound sad?",
    "How much water should I drink during a long hike in hot weather?",
    "What happens to my workplace pension if I change jobs?",
    "Why do onions make you cry when you cut them?",
    "Is a tomato a fruit or a vegetable?",
    "What is the difference between weather and climate?",
    "How do I get a red wine stain out of a cotton shirt?",
    "What does the legal term 'statute of limitations' mean?",
    "Why did the Titanic sink so quickly after hitting the iceberg?",
    "What is a good first programming language for a ten-year-old?",
    "How do vaccines train the immune system?",
    "What should I write in a thank-you note after a job interview?",
    "How far can a typical electric car drive on a single charge?",
    "Why do we have leap years?",
    "What are the signs that a watermelon is ripe?",
    "What is the offside rule in football?",
    "How do I convert a baking recipe from cups to grams?",
    "What is the difference between an index fund and an actively managed fund?",
    "Why do aeroplanes leave white trails across the sky?",
    "Can I use olive oil for deep frying?",
)

EXPLAIN = (
    "Explain how a bloom filter works to a new engineer.",
    "Explain compound interest to someone opening their first savings account.",
    "Explain how photosynthesis turns sunlight into sugar.",
    "Explain the idea of supply and demand using the price of concert tickets.",
    "Explain what a hash table is and why looking up a key is usually fast.",
    "Explain how the electoral college works in US presidential elections.",
    "Explain why the Maillard reaction makes a seared steak taste so good.",
    "Explain plate tectonics and how it causes earthquakes.",
    "Explain what inflation is and why a little of it is considered healthy.",
    "Explain how public-key encryption lets two strangers agree on a secret.",
    "Explain the difference between a stock and a bond to a teenager.",
    "Explain how the heart pumps blood around the body.",
    "Explain what Big O notation measures, with a couple of examples.",
    "Explain how a bill becomes law in the United Kingdom.",
    "Explain why ice floats on water when most solids sink in their own liquid.",
    "Explain why marathon runners 'hit the wall' and how they try to avoid it.",
    "Explain what a Git rebase does and how it differs from a merge.",
    "Explain how a sourdough starter makes bread rise without commercial yeast.",
    "Explain what a black hole is and why light cannot escape from it.",
    "Explain how GPS works out where my phone is.",
    "Explain the concept of opportunity cost with an everyday example.",
    "Explain how the circle of fifths helps musicians understand key signatures.",
    "Explain what the Pythagorean theorem says and why it is true.",
    "Explain how antibiotic resistance develops in bacteria.",
    "Explain the difference between TCP and UDP to a junior developer.",
    "Explain how a mortgage amortisation schedule works.",
    "Explain why the Industrial Revolution began in Britain.",
    "Explain how a refrigerator keeps food cold.",
    "Explain what a p-value is, without using jargon.",
    "Explain how software containers differ from virtual machines.",
    "Explain what 'burden of proof' means in a criminal trial.",
    "Explain how tides are caused by the Moon and the Sun.",
    "Explain recursion to someone who has just started programming.",
    "Explain how jet lag affects the body and why flying east feels harder.",
    "Explain how a garbage collector reclaims memory in a language like Java.",
    "Explain the basics of double-entry bookkeeping to a small-business owner.",
)

CODE = (
    "Write a Python function that returns the n-th Fibonacci number using iteration, not recursion.",
    "Write a JavaScript function that debounces another function, with a configurable delay in milliseconds.",
    "Write a SQL query that finds the top five customers by total order value, given the tables "
    "customers(id, name) and orders(id, customer_id, amount).",
    "Write a Rust function that reverses the order of the words in a &str and returns a new String.",
    "Write a Go function that reads a text file and counts how many times each word appears in it.",
    "Write a Bash script that deletes files older than 30 days in a given directory, printing each file it removes.",
    "Write a C function that checks whether a null-terminated string is a palindrome, ignoring case.",
    "Fix this Python function. It should return the average of a list but crashes on an empty list:\n\n"
    "def average(xs):\n    return sum(xs) / len(xs)\n",
    "Fix the bug in this JavaScript snippet, which logs 3 three times instead of 0, 1 and 2:\n\n"
    "for (var i = 0; i < 3; i++) {\n  setTimeout(() => console.log(i), 100);\n}\n",
    "Convert this Python function to JavaScript:\n\n"
    "def is_leap(year):\n    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n",
    "Write pytest tests for a function slugify(text) that lowercases the text, replaces spaces with "
    "hyphens and strips punctuation.",
    "Write a Python class for a fixed-size ring buffer with an append method and support for iteration.",
    "Write a SQL query that lists every department with the number of employees in it, including departments "
    "with no employees. Tables: departments(id, name), employees(id, name, department_id).",
    "Fix this C function, which is supposed to copy a string but sometimes crashes:\n\n"
    "char *copy(const char *s) {\n    char *out = malloc(strlen(s));\n    strcpy(out, s);\n    return out;\n}\n",
    "Write a Go HTTP handler that returns the current server time as JSON.",
    'Convert this Bash loop to Python:\n\nfor f in *.txt; do\n  wc -l "$f"\ndone\n',
    'Write a Rust function that parses a string like "12,7,3" into a Vec<i32>, returning an error for bad input.',
    "Write a JavaScript function that deep-clones a plain object containing nested objects and arrays.",
    "Write a Python function that checks whether a string is a well-formed IPv4 address.",
    "Write a Bash one-liner that prints the ten largest files under the current directory.",
    "Fix this SQL query, which fails with an error about GROUP BY:\n\n"
    "SELECT customer_id, order_date, SUM(amount)\nFROM orders\nGROUP BY customer_id;\n",
    "Write table-driven unit tests in Go for a function Max(a, b int) int.",
    "Write a C program that reads integers from standard input until end of file and prints their sum.",
    "Convert this JavaScript function to Python:\n\n"
    "function countVowels(s) {\n  return [...s.toLowerCase()].filter(c => 'aeiou'.includes(c)).length;\n}\n",
    "Write a Python generator that yields successive chunks of a given size from a list.",
    "Write a Rust struct for a bank account with deposit and withdraw methods, where withdraw returns an "
    "error if the balance is insufficient.",
    "Write a SQL query that finds duplicate email addresses in a table users(id, email).",
    "Fix this Python code, which should remove the even numbers from a list but skips some of them:\n\n"
    "nums = [2, 4, 5, 6, 8]\nfor n in nums:\n    if n % 2 == 0:\n        nums.remove(n)\n",
    'Write a JavaScript function that formats a number of seconds as "HH:MM:SS".',
    "Write a Go function that merges two sorted slices of integers into one sorted slice.",
    'Write a Bash script that checks whether a website returns HTTP 200 and prints "up" or "down".',
    "Convert this C function to Rust:\n\n"
    "int sum_array(const int *a, size_t n) {\n    int total = 0;\n"
    "    for (size_t i = 0; i < n; i++) total += a[i];\n    return total;\n}\n",
    "Write Jest tests for a JavaScript function isValidEmail(str) that returns true or false.",
    "Write a Python function that flattens an arbitrarily nested list of integers.",
    "Fix this Go function, which does not compile:\n\n"
    "func divide(a, b int) int, error {\n    if b == 0 {\n"
    '        return 0, errors.New("divide by zero")\n    }\n    return a / b, nil\n}\n',
    "Write a SQL query that calculates a running total of daily sales from a table sales(day DATE, amount NUMERIC).",
    "Write a C function that reverses a singly linked list in place and returns the new head.",
    "Write a Python script that reads a CSV file of expenses with the columns date, category and amount, "
    "and prints the total for each category.",
    "Fix this Rust program, which the borrow checker rejects:\n\n"
    'fn main() {\n    let s = String::from("hi");\n    let t = s;\n    println!("{} {}", s, t);\n}\n',
    "Write a JavaScript function that groups an array of objects by the value of a given key.",
    "Write a Bash function that makes a dated backup copy of a file, for example notes.txt becoming "
    "notes.txt.2024-05-01.bak.",
    "Write a Python function that converts a Roman numeral string to an integer, with a few tests.",
)

LIST = (
    "List ten ways to reduce food waste at home.",
    "Give me a packing list for a three-day hiking trip.",
    "List eight questions to ask a landlord before signing a lease.",
    "Give me five ideas for a cheap weekend date.",
    "List the planets in order from the Sun, with one interesting fact about each.",
    "List seven common mistakes new managers make.",
    "Give me a weekly meal plan for a vegetarian on a tight budget.",
    "List ten classic novels worth reading before the age of thirty.",
    "List six warm-up exercises to do before a run.",
    "Give me a checklist for moving into a new flat.",
    "List the main causes of the First World War.",
    "List eight useful keyboard shortcuts for a spreadsheet program.",
    "Give me ten icebreaker questions for a team meeting.",
    "List five ways to improve the battery life of a smartphone.",
    "List the steps to change a flat tyre on a car.",
    "Give me a list of twelve spices every home kitchen should have.",
    "List six signs of burnout at work and what to do about each one.",
    "List ten tips for writing a clear bug report.",
    "Give me seven ideas for indoor activities for a child on a rainy day.",
    "List the documents I should bring when applying for a passport.",
    "List eight things to check before publishing a personal website.",
    "Give me a list of beginner-friendly houseplants that tolerate low light.",
    "List five famous jazz albums and say why each one matters.",
    "List the common logical fallacies, with a one-line example of each.",
    "Give me a checklist for preparing my home before a two-week holiday.",
    "List nine ways to save money on energy bills in winter.",
    "List the first ten elements of the periodic table with their symbols.",
    "Give me six talking points for asking my boss for a pay rise.",
    "List eight habits that help with learning a new language.",
    "List the essential tools for a beginner woodworker.",
    "Give me a list of things to do in Lisbon over two days.",
)

REWRITE = (
    "Make this email more formal.\n\n"
    "hey Sam, just a heads up that the report's gonna be late, sorry. the data from the sales team came in "
    "way later than we thought and half of it was wrong so we had to chase them for fixes. i reckon we can "
    "get it to you by thursday afternoon, friday at the latest. let me know if thats a problem and we can "
    "figure something out, maybe send a partial version first. cheers, Priya",
    "Rewrite this paragraph in simpler language for a ten-year-old.\n\n"
    "Photosynthetic organisms convert electromagnetic radiation from the Sun into chemical energy stored "
    "within carbohydrate molecules. This process occurs primarily in the chloroplasts, specialised organelles "
    "containing the pigment chlorophyll, which absorbs light most efficiently in the red and blue portions of "
    "the spectrum. Water molecules are split during the light-dependent reactions, releasing oxygen as a "
    "by-product, while carbon dioxide absorbed from the atmosphere is incorporated into sugars during the "
    "subsequent cycle of light-independent reactions.",
    "Fix the grammar and spelling in this passage.\n\n"
    "Me and my brother goes to the market every saturday morning, we buys vegetables, bread and sometimes a "
    "cake if their is any left. The man who sell the apples always give us a extra one for free, he say its "
    "because we are his most loyal customer. Last week it rained so hard that most of the stalls was closed, "
    "but we still find the baker, who was stood under a big umbrella and looking very cold.",
    "Change this passage from the present tense to the past tense.\n\n"
    "The train pulls into the station just after dawn. Maria steps onto the platform, pulls her coat tighter "
    "and looks for a sign pointing to the old town. The streets are quiet, and the only sound is a street "
    "sweeper brushing leaves into neat piles. She finds a small café that is just opening, orders a coffee "
    "and a pastry, and sits by the window. Outside, the city slowly wakes up: shutters rise, delivery vans "
    "arrive, and children hurry to school with their bags bouncing on their backs.",
    "Turn this into a bulleted list of action items, each with an owner where one is named.\n\n"
    "Following today's meeting, a few things need to happen before the launch. Tom will finalise the pricing "
    "page and send it to legal for review by Wednesday. Aisha needs to update the onboarding emails so they "
    "mention the new free tier, and she will also check that the unsubscribe link works. The support team "
    "should prepare answers to the ten most likely customer questions. Finally, someone from engineering, "
    "probably Lee, has to confirm that the payment system can handle twice the usual traffic on launch day.",
    "Make this passage shorter, keeping the key points, in no more than 40 words.\n\n"
    "Our community garden is looking for volunteers to help over the summer months. We have around thirty "
    "raised beds that need watering, weeding and general care, and with many of our regular members going "
    "away on holiday, we are worried that the plants will suffer. No gardening experience is needed, as we "
    "will show you everything you need to know. Even an hour a week would make a real difference. Volunteers "
    "are welcome to take home some of the vegetables they help to grow, including tomatoes, courgettes, beans "
    "and lettuce.",
    "Rewrite this product description to sound more enthusiastic and persuasive.\n\n"
    "This backpack has a capacity of 25 litres. It is made from recycled polyester and is water resistant. "
    "There is a padded compartment that fits a laptop up to 15 inches. The shoulder straps are adjustable and "
    "there is a chest strap. It has two side pockets for water bottles and a small front pocket for keys and "
    "a phone. It comes in black, grey and green. It weighs 800 grams.",
    "Rewrite this in the passive voice wherever it sounds natural.\n\n"
    "The city council approved the new cycling plan on Monday. Engineers will build protected bike lanes "
    "along the three busiest roads, and workers will install fifty new bike racks near the train station. The "
    "council also asked local schools to run cycling safety lessons for pupils. Critics argued that the plan "
    "would slow down traffic, but supporters pointed to other cities where similar schemes reduced accidents. "
    "The council expects contractors to finish the first lane by the end of the year.",
    "Rewrite this passage in plain English, removing the jargon.\n\n"
    "Going forward, we need to leverage our core competencies to drive synergies across verticals and move "
    "the needle on customer engagement. Stakeholders should circle back offline to align on key deliverables "
    "and ensure bandwidth is allocated to high-impact workstreams. Let's take a deep dive into the "
    "low-hanging fruit and socialise a roadmap that unlocks value at scale while we double-click on the pain "
    "points surfaced during the last sprint retrospective.",
    "Rewrite this paragraph in the third person, using the name Daniel.\n\n"
    "I started running three years ago, mostly because my doctor told me I needed more exercise. At first I "
    "could barely manage ten minutes without stopping, and I felt embarrassed every time someone overtook me "
    "in the park. I kept going, though, and slowly the distances grew. Last spring I ran my first half "
    "marathon, and although I finished near the back, I cried when I crossed the line. Now I run four times "
    "a week and I cannot imagine my life without it.",
    "Make this complaint letter more polite without losing its firmness.\n\n"
    "I am sick of your company ignoring me. I ordered a dining table six weeks ago, paid in full, and it "
    "still hasn't arrived. Every time I call I get a different excuse and nobody ever calls me back like they "
    "promise. This is ridiculous. I want the table delivered this week or my money back, and if I don't hear "
    "from someone by Friday I'm going to leave reviews everywhere telling people exactly how useless you are.",
    "Rewrite this recipe method as numbered steps.\n\n"
    "Start by heating a splash of oil in a large pan and softening a chopped onion for about five minutes, "
    "then add two crushed garlic cloves and a teaspoon of cumin and cook for another minute. Tip in a tin of "
    "chopped tomatoes and a tin of drained chickpeas, season with salt and pepper, and let everything simmer "
    "for fifteen minutes until thick. Stir through a big handful of spinach until it wilts, squeeze over half "
    "a lemon and serve with rice or warm flatbread.",
    "Simplify this clause so that an ordinary tenant can understand it.\n\n"
    "The Tenant shall not, without the prior written consent of the Landlord, such consent not to be "
    "unreasonably withheld, assign, sublet or otherwise part with possession of the Premises or any part "
    "thereof. The Tenant shall keep the interior of the Premises in good and tenantable repair and condition, "
    "fair wear and tear excepted, and shall permit the Landlord or its agents, upon not less than "
    "twenty-four hours' written notice, to enter the Premises at reasonable times for the purpose of "
    "inspection.",
    "Rewrite this notice as a friendly note from one neighbour to another.\n\n"
    "Notice to the residents of flat 4B. Your dog has been barking for extended periods during the daytime "
    "on weekdays, typically between 9am and 1pm. This has been observed on at least five occasions over the "
    "last two weeks. Several residents work from home and find the noise disruptive. Please take steps to "
    "address this issue promptly. If the situation continues, the matter may be raised with the building "
    "management committee at its next meeting.",
    "Rewrite this paragraph to be more concise, removing the repetition.\n\n"
    "The new software update, which was released last week, includes a number of new features that are new "
    "to this version. One of the new features is a dark mode, which makes the screen darker, and which many "
    "users had requested. Another feature is faster syncing, which means files sync more quickly than they "
    "did before. The update also fixes several bugs, including bugs that caused the app to crash, which was a "
    "problem that some users had experienced when using the app.",
    "Change this passage from British to American spelling and vocabulary.\n\n"
    "After work I popped to the shop on the high street to buy some biscuits and a packet of crisps. The "
    "queue was enormous, so I nipped next door to the chemist to pick up my prescription first. On the way "
    "home I realised my mobile was almost flat, and I had to ring my flatmate from a phone box to say I'd be "
    "late. We'd planned to watch a film together, but by the time I got back she'd already fallen asleep on "
    "the sofa with the telly on.",
    "Rewrite this as a paragraph for a formal cover letter.\n\n"
    "So I've been working in restaurants for about six years now, mostly as a line cook but the last two as "
    "a sous chef. I'm really good under pressure, I've trained loads of new staff and I actually like sorting "
    "out stock and rotas, which most chefs hate. I'd love to work at your place because I've eaten there a "
    "few times and the food is amazing, and I want to learn more about seasonal cooking and working with "
    "local farms.",
    "Turn this paragraph into a short poem of four to eight lines.\n\n"
    "The lighthouse on the headland has stood for over a hundred and fifty years. Every night its beam sweeps "
    "across the water, warning ships away from the rocks below. The keepers who once lived there are long "
    "gone, replaced by an automatic lamp, but people still walk up the cliff path at dusk to watch the light "
    "come on. On stormy nights the waves crash so high that spray reaches the lantern room, and yet the light "
    "keeps turning, steady and patient, as it always has.",
    "Rewrite this as a professional post for a careers networking site.\n\n"
    "Big news!! I finally finished my data science bootcamp after 16 weeks of pain lol. Learned a ton about "
    "Python, SQL, machine learning and how to make charts that don't look terrible. My final project "
    "predicted which bikes in the city share scheme would run out first, and it actually kinda worked. Huge "
    "thanks to my mentor Jess who put up with all my dumb questions. Now looking for my first job in data, so "
    "hit me up if you're hiring!!",
    "Rewrite this passage in the future tense, as a description of next year's festival.\n\n"
    "The festival opened on Friday evening with a parade through the old town. Musicians from twelve "
    "countries played on four stages, and food stalls lined the river selling dishes from around the world. "
    "On Saturday, children took part in a lantern-making workshop, and in the evening the lanterns floated "
    "down the river in a long glowing line. The final night ended with fireworks over the castle, and "
    "thousands of visitors stayed late to dance in the main square.",
    "Rewrite this paragraph so it suits a children's science book.\n\n"
    "Volcanic eruptions occur when magma, molten rock generated by elevated temperatures deep within the "
    "Earth's mantle, ascends through fissures in the crust. Accumulated gases dissolved in the magma exert "
    "substantial pressure, and when this pressure exceeds the strength of the overlying rock, an explosive "
    "release can occur. The ejected material may include lava flows, pyroclastic fragments and ash clouds "
    "capable of disrupting aviation across vast distances. Volcanologists monitor seismic activity and gas "
    "emissions to forecast potential eruptions.",
    "Turn these meeting notes into a clear paragraph of prose.\n\n"
    "- budget for Q3 approved, but marketing cut by 10%\n"
    "- hiring freeze continues until September\n"
    "- new office in Leeds opens 1 Oct, Sarah leading the move\n"
    "- staff survey results: morale up, but lots of complaints about workload\n"
    "- IT to replace the old laptops, starting with the sales team\n"
    "- next all-hands on 15 Aug, remote option available\n"
    "- reminder: expense claims must be in by the 5th of each month",
    "Rewrite this paragraph in a more neutral, less emotional tone.\n\n"
    "The referee's decision last night was an absolute disgrace. Anyone with eyes could see that the striker "
    "was dragged down in the box, yet the so-called official just waved play on as if nothing had happened. "
    "The fans were rightly furious, and the manager's post-match comments were, if anything, far too "
    "restrained. This kind of shocking incompetence ruins the game for everyone, and it is high time the "
    "league did something about the appalling standard of refereeing this season.",
    "Rewrite this paragraph so that no sentence is longer than fifteen words.\n\n"
    "When we arrived at the campsite, which was much further from the road than the website had suggested, "
    "we discovered that the pitch we had booked was underwater after two days of heavy rain, so the owner, "
    "who was very apologetic, moved us to a field on higher ground near the woods, where we pitched our tent "
    "just as the sun went down and the temperature dropped sharply, leaving us scrambling for extra jumpers "
    "and the flask of tea we had fortunately packed.",
    "Rewrite this technical update for a non-technical manager.\n\n"
    "We migrated the primary database from a single instance to a three-node replicated cluster with "
    "automatic failover. Read queries are now load-balanced across replicas, which reduced p95 latency on the "
    "dashboard endpoints from 800 ms to around 200 ms. We also enabled point-in-time recovery, so we can "
    "restore data to any second within the last seven days. The remaining work is to move the reporting jobs "
    "onto a dedicated replica so they stop competing with user traffic during peak hours.",
    "Make this wedding toast funnier while keeping it warm.\n\n"
    "I have known Ben since we were eleven years old, when we sat next to each other in maths class. He has "
    "always been loyal, kind and generous, and he is the first person I call when something goes wrong. When "
    "he met Laura, we could all see how happy she made him. She is thoughtful, clever and patient, which is "
    "good, because Ben can be very stubborn. I am so proud to stand here today and wish them a long and happy "
    "life together.",
    "Rewrite this passage as a dialogue between the two characters.\n\n"
    "Anna told her father that she wanted to leave university and start her own bakery. He was worried and "
    "asked how she would pay for it, and whether she had thought about how hard the hours would be. She "
    "explained that she had saved some money, found a small shop to rent and had already been selling cakes "
    "at the weekend market for a year. Eventually he admitted that he was proud of her, although he still "
    "wished she would finish her degree first.",
    "Rewrite this paragraph in a formal, academic register.\n\n"
    "Loads of people think social media is making teenagers miserable, but it's actually pretty complicated. "
    "Some studies find a link between heavy use and feeling anxious or down, while others find hardly any "
    "effect at all. A big problem is that most research just asks kids how much time they spend online, "
    "which isn't very accurate. Also, it might be that kids who already feel bad end up using their phones "
    "more, not the other way round.",
    "Turn this paragraph into a short FAQ with three questions and answers.\n\n"
    "Our library now lends more than books. Members can borrow board games, musical instruments such as "
    "ukuleles and keyboards, and even tools like drills and sewing machines. Items can be kept for up to "
    "three weeks and renewed once online, as long as nobody else has reserved them. Membership is free for "
    "anyone who lives, works or studies in the district, and you only need a proof of address to sign up. "
    "Late returns are charged at twenty pence per day, with a maximum fine of five pounds.",
    "Rewrite this paragraph to remove the gendered language.\n\n"
    "Every employee should make sure he locks his computer before leaving his desk. If a staff member forgets "
    "his password, he should contact the IT helpdesk, where a technician will reset it for him. The chairman "
    "of the security committee has asked that each manager remind his team about phishing emails, and any "
    "workman visiting the building must sign in at reception and be accompanied by a member of staff at all "
    "times. A salesman travelling abroad should always use the company VPN.",
)

SUMMARISE = (
    "Summarise this passage in two sentences.\n\n"
    "Tea arrived in Britain in the middle of the seventeenth century, at first as an expensive curiosity sold "
    "in London coffee houses. Its popularity grew after Catherine of Braganza, the Portuguese wife of Charles "
    "II, made tea drinking fashionable at court. For much of the following century, heavy taxes made tea so "
    "costly that smuggling became a large and organised business, with ships landing illegal cargoes on quiet "
    "beaches along the south coast. When the government slashed the duty in 1784, smuggling collapsed almost "
    "overnight and tea became affordable for ordinary households. By the nineteenth century it was a daily "
    "habit across all social classes, and plantations had been established in India and Ceylon to reduce the "
    "country's dependence on Chinese supply.",
    "Summarise the main points of this article for a busy reader.\n\n"
    "Researchers have long suspected that sleep plays a role in memory, and recent studies have sharpened the "
    "picture. During deep, slow-wave sleep, the brain appears to replay patterns of activity recorded during "
    "the day, transferring information from the hippocampus, a short-term store, to the cortex, where "
    "long-term memories are kept. Experiments in which volunteers learned word pairs before a nap found that "
    "those who reached deep sleep remembered significantly more than those who stayed awake or slept only "
    "lightly. Dreaming, or REM, sleep seems to matter more for emotional memories and for creative problem "
    "solving, helping people to notice hidden connections between ideas. The findings have practical "
    "implications: students who sacrifice sleep to cram for exams may be undermining the very learning they "
    "are trying to achieve.",
    "Summarise this customer email in one sentence, then list any actions we need to take.\n\n"
    "Hello, I'm writing about order 58213, which arrived yesterday. The good news is that the sofa itself is "
    "lovely and exactly the colour I wanted. Unfortunately, one of the wooden legs was missing from the box, "
    "and the assembly instructions refer to a set of screws that also weren't included. I've checked the "
    "packaging twice. I'd also like to ask whether you sell matching cushion covers, as I couldn't find them "
    "on your website. Could you please send the missing leg and screws as soon as possible? I'm at home most "
    "weekdays after 2pm if a courier needs to deliver them. Thanks, Helen Marsh",
    "Give me a three-bullet summary of this passage.\n\n"
    "The shift to remote work that began during the pandemic has settled into a mixed pattern. Surveys "
    "suggest that most office workers in large economies now spend two or three days a week at home, a model "
    "usually called hybrid work. Employers report that productivity has held up better than many expected, "
    "although managers worry about the training of junior staff, who learn a great deal by watching "
    "experienced colleagues. Commercial property markets have been hit hard, with city-centre office "
    "vacancies at record levels in several countries. Meanwhile, workers value the time saved on commuting so "
    "highly that many say they would accept a lower salary to keep it. Some companies have ordered staff back "
    "full time, but these mandates have often led to resignations, particularly among senior and highly "
    "skilled employees who can easily find work elsewhere.",
    "Summarise this short story in about fifty words.\n\n"
    "Every morning for forty years, Mr Okafor opened his watch-repair shop at exactly eight o'clock. The "
    "neighbourhood changed around him: the bakery became a phone shop, the bookshop became a café, and fewer "
    "people wore watches at all. One winter, a girl of about twelve came in with a broken pocket watch that "
    "had belonged to her grandfather. Mr Okafor spent three evenings taking it apart, cleaning each tiny gear "
    "and replacing a spring he had to make himself. When she returned, the watch was ticking, and she asked "
    "him how he had learned to do it. He hesitated, then offered to teach her. By spring, she was coming "
    "every Saturday, and the sign in the window had a new line painted beneath his name: 'and apprentice'.",
    "Summarise this passage for a ten-year-old.\n\n"
    "Coral reefs cover less than one per cent of the ocean floor, yet they support roughly a quarter of all "
    "marine species. The reefs are built by tiny animals called polyps, which produce hard skeletons of "
    "calcium carbonate and live in partnership with microscopic algae. The algae provide the polyps with food "
    "through photosynthesis and give corals their bright colours. When the water becomes too warm, the "
    "corals expel the algae and turn white, a process known as bleaching. If temperatures return to normal "
    "quickly, the corals can recover, but prolonged heat waves kill them. Rising ocean temperatures, "
    "pollution and overfishing have already damaged large areas of reef, and scientists are experimenting "
    "with heat-tolerant corals and restoration projects to help them survive.",
    "Summarise these meeting minutes in a short paragraph.\n\n"
    "Minutes of the Parents' Association meeting, 12 March. Present: eleven members and the head teacher. "
    "The treasurer reported that the winter fair raised £2,340, slightly more than last year, mainly thanks "
    "to the raffle. Members agreed to spend £1,500 on new playground equipment, subject to the head teacher "
    "getting quotes from at least two suppliers. There was a long discussion about traffic at the school "
    "gate; it was agreed to ask the council for a 'school street' trial that would close the road to cars at "
    "drop-off and pick-up times. The summer picnic will take place on 21 June, and volunteers are needed to "
    "run the food stalls. The next meeting is on 9 April.",
    "Summarise the argument of this passage, then say whether you find it convincing.\n\n"
    "Cities should make public transport free at the point of use. Fares raise surprisingly little money "
    "once the cost of collecting them is subtracted: ticket machines, inspectors and payment systems are "
    "expensive to run. Free travel would encourage people to leave their cars at home, reducing congestion "
    "and air pollution, and it would help low-income residents, who spend a larger share of their income on "
    "getting to work. Critics say free buses would become overcrowded, but overcrowding is a sign of success "
    "and an argument for more investment, not less. Several cities that have tried the idea, such as Tallinn "
    "in Estonia, have reported higher ridership and strong public support, suggesting that the policy is both "
    "popular and workable.",
    "Summarise this product review in two sentences, noting the pros and the cons.\n\n"
    "I've been using this budget air fryer every day for about two months. It heats up quickly and the basket "
    "is big enough for chips for two people, though you'd struggle to cook for a family of four in one go. "
    "Chicken thighs come out crispy and juicy in about twenty minutes, and frozen food is far better than in "
    "the oven. The controls are simple, with a dial for temperature and a timer, which I prefer to fiddly "
    "touch screens. On the downside, it's quite loud, the non-stick coating on the basket has already started "
    "to scratch, and the outside gets hot enough that you need to be careful with children around. For the "
    "price, it's good value, but I'd pay more for better build quality next time.",
    "Summarise this passage about the history of the bicycle.\n\n"
    "The earliest ancestor of the bicycle, the 'running machine' invented by Karl Drais in 1817, had no "
    "pedals; riders pushed themselves along with their feet. In the 1860s, French makers added pedals to the "
    "front wheel, creating the velocipede, nicknamed the 'boneshaker' because of its iron tyres and rough "
    "ride. To go faster, designers enlarged the front wheel, producing the high-wheeled penny-farthing, which "
    "was quick but dangerous, since riders sat high above the ground and could be thrown over the handlebars. "
    "The breakthrough came in the 1880s with the 'safety bicycle', which had two wheels of equal size and a "
    "chain driving the rear wheel. Combined with the pneumatic tyre, patented by John Dunlop in 1888, it made "
    "cycling comfortable and safe, and a cycling boom followed across Europe and America.",
    "Summarise this news item in one paragraph for an investor newsletter.\n\n"
    "Shares in the regional grocery chain rose eight per cent on Tuesday after it reported better-than-expected "
    "quarterly results. Sales at stores open for more than a year grew 4.2 per cent, driven by its own-brand "
    "products and a new delivery service that now accounts for a tenth of revenue. Profit margins improved "
    "slightly despite higher wages, as the company cut energy costs by fitting stores with more efficient "
    "refrigeration. However, management warned that food price inflation was easing, which could slow sales "
    "growth later in the year, and said it would spend more on price cuts to fend off discount rivals. "
    "Analysts broadly welcomed the update, though several noted that the company's debt remains high after "
    "last year's acquisition of a smaller competitor.",
    "Summarise this passage, keeping only the practical advice.\n\n"
    "Many people assume that a strong password needs to be a jumble of random symbols, but length matters far "
    "more than complexity. A passphrase made of four or five unrelated words is both harder to crack and "
    "easier to remember than a short string of characters. The real danger, though, is reusing the same "
    "password on several websites: when one site is breached, criminals try the leaked details everywhere "
    "else. A password manager solves this by generating and storing a unique password for every account, so "
    "you only need to remember one. It is also worth switching on two-factor authentication for important "
    "accounts such as email and banking, because even a stolen password is then not enough on its own. "
    "Finally, be suspicious of any message that asks you to log in through a link.",
    "Summarise this passage about the Apollo 13 mission.\n\n"
    "Apollo 13 launched in April 1970 with the aim of landing on the Moon, but two days into the flight an "
    "oxygen tank in the service module exploded. The blast crippled the spacecraft's main power and oxygen "
    "supplies, and the landing was immediately abandoned. The three astronauts moved into the lunar module, "
    "which was designed to support two people for about two days, and used it as a lifeboat for the four-day "
    "journey home. Engineers on the ground worked around the clock to improvise solutions, most famously a "
    "way of fitting square carbon dioxide filters into round sockets using plastic bags, cardboard and tape. "
    "The crew endured freezing temperatures and little water, but they splashed down safely in the Pacific, "
    "and the mission became known as a 'successful failure'.",
    "Summarise this job advert in three bullet points.\n\n"
    "We are a small, friendly design agency in Bristol looking for a junior web developer to join our team of "
    "eight. You will build and maintain websites for clients ranging from local charities to national "
    "retailers, working closely with our designers to turn mock-ups into fast, accessible pages. You should "
    "be comfortable with HTML, CSS and JavaScript, and some experience with a modern framework would be a "
    "bonus. We don't mind whether you learned at university, at a bootcamp or on your own, as long as you can "
    "show us things you have built. The role is full time, with two days a week in the office, and the salary "
    "is £28,000 to £32,000 depending on experience. We offer 28 days of holiday, a training budget and a very "
    "good coffee machine.",
    "Summarise what this passage says about the benefits and risks of intermittent fasting.\n\n"
    "Intermittent fasting, which restricts eating to certain hours of the day or certain days of the week, "
    "has become one of the most popular diet trends of the past decade. Supporters claim that it helps with "
    "weight loss, improves blood sugar control and may even slow ageing. Clinical trials suggest that people "
    "do lose weight on these plans, but usually about as much as they would by simply eating fewer calories "
    "every day; the main benefit may be that some people find a fixed eating window easier to stick to. "
    "Evidence for longer-term health effects in humans is still limited. Doctors advise caution for people "
    "with diabetes, those who are pregnant and anyone with a history of eating disorders, for whom long gaps "
    "between meals can be harmful.",
    "Give me a one-line summary and three key takeaways from this passage.\n\n"
    "A study of software teams at a large technology company looked at what made some groups consistently "
    "more effective than others. Surprisingly, the most important factor was not the seniority of the "
    "engineers, the tools they used or how many hours they worked. Instead, the best teams were those in "
    "which members felt safe to admit mistakes, ask basic questions and challenge ideas without fear of being "
    "embarrassed. Researchers call this psychological safety. Teams with high levels of it reported problems "
    "earlier, shared knowledge more freely and recovered faster from failed releases. Managers could "
    "encourage it by admitting their own errors, inviting quieter colleagues to speak and responding to bad "
    "news with curiosity rather than blame.",
    "Summarise this passage about the Great Fire of London.\n\n"
    "The Great Fire of London began in the early hours of 2 September 1666 at a bakery on Pudding Lane. A dry "
    "summer and a strong east wind helped the flames spread rapidly through the narrow streets of timber "
    "houses. The Lord Mayor initially dismissed the danger, and firefighting efforts were slow and "
    "disorganised. Over four days the fire destroyed more than thirteen thousand houses, eighty-seven parish "
    "churches and the medieval St Paul's Cathedral. Remarkably, only a handful of deaths were recorded, "
    "though historians believe the true figure was higher. In the aftermath, new building regulations "
    "required houses to be built of brick or stone, and Christopher Wren designed a new St Paul's along with "
    "dozens of the city's churches.",
    "Summarise this email thread in a few sentences for a colleague who wasn't copied in.\n\n"
    "From Mark: Can we move the client demo from Tuesday to Thursday? The new search feature isn't stable "
    "yet.\n"
    "From Julia: Thursday is tricky because the client's CTO is travelling. Could we do Wednesday afternoon "
    "instead?\n"
    "From Mark: Wednesday works if QA can finish testing by Tuesday night. Ravi, is that realistic?\n"
    "From Ravi: We can do it if we skip the full regression suite and only test search and checkout. I'd "
    "rather not, but it's doable.\n"
    "From Julia: Let's do that, and we'll run the full suite on Thursday before anything goes to production. "
    "I'll tell the client it's Wednesday at 3pm.\n"
    "From Mark: Great, thanks both.",
    "Summarise this passage about learning a musical instrument as an adult.\n\n"
    "Many adults believe that it is too late to learn a musical instrument, but research and experience "
    "suggest otherwise. While children may find it easier to develop perfect pitch or very fine motor skills, "
    "adults have advantages of their own: they can understand music theory more quickly, practise more "
    "deliberately and choose pieces they genuinely love, which keeps them motivated. The biggest obstacle is "
    "usually time, and teachers recommend short daily practice sessions of fifteen to twenty minutes rather "
    "than a long session once a week. Joining a community band, choir or group class can also help, both for "
    "motivation and because playing with others develops listening and timing. Most importantly, adult "
    "learners should expect slow progress at first and measure themselves against their own past playing "
    "rather than against professionals.",
    "Summarise this passage in exactly three sentences.\n\n"
    "The town of Hallstatt in Austria, with its pastel houses squeezed between a lake and steep mountains, "
    "has become one of the most photographed places in Europe. Its population is under eight hundred, yet on "
    "busy summer days it receives up to ten thousand visitors, many arriving on tour buses for a stop of just "
    "an hour or two. Residents complain of crowded streets, drones flying over their gardens and tourists "
    "peering into their windows. The local council has responded by limiting the number of coaches, "
    "introducing time slots for buses and even putting up a wooden fence to block a popular photo spot, a "
    "move that caused controversy online. Some locals argue that tourism keeps the town's economy alive, "
    "while others say it has turned their home into an open-air museum.",
    "Summarise the findings described in this passage about street trees.\n\n"
    "A team of researchers studied the effect of street trees on summer temperatures in five European cities. "
    "Using satellite data and sensors mounted on bicycles, they found that streets with dense tree cover were "
    "on average 3 degrees Celsius cooler during the afternoon than nearby streets without trees, with "
    "differences of up to 8 degrees on the hottest days. The cooling came mainly from shade and from water "
    "evaporating from the leaves. The researchers estimated that increasing tree cover to 30 per cent in each "
    "city could prevent around a third of the deaths linked to summer heat. However, they cautioned that "
    "trees need space, water and care to grow, and that planting must be targeted at poorer neighbourhoods, "
    "which currently tend to have the fewest trees and the highest temperatures.",
    "Summarise this passage for a slide with no more than four short bullet points.\n\n"
    "Our quarterly customer survey received 1,240 responses, up from 950 last quarter. Overall satisfaction "
    "rose from 7.1 to 7.6 out of ten, with the biggest improvement in delivery times after we opened the "
    "second warehouse. Customers continue to praise the quality of our products and the friendliness of our "
    "support staff. However, complaints about the website increased: many users find the checkout confusing, "
    "and several mentioned that discount codes often fail to apply. Mobile users were noticeably less "
    "satisfied than desktop users. Finally, nearly forty per cent of respondents said they would like a "
    "subscription option for items they buy regularly, such as coffee and cleaning products.",
    "Summarise this passage about the invention of the telephone.\n\n"
    "Alexander Graham Bell is usually credited with inventing the telephone, receiving a US patent in March "
    "1876. However, the story is more complicated. On the very same day that Bell's lawyer filed his "
    "application, the inventor Elisha Gray submitted a notice describing a similar device, and for years the "
    "two sides argued over who had got there first. Decades earlier, the Italian inventor Antonio Meucci had "
    "developed a voice-communication apparatus, but he was too poor to renew his provisional patent. Bell's "
    "company fought and won hundreds of legal battles over the patent, which helped it grow into one of the "
    "largest businesses in the world. Today most historians see the telephone as the product of many people "
    "working on the same problem at the same time.",
    "Summarise this passage and suggest a title for it.\n\n"
    "When Lina moved from a small village to a city of four million people, the thing that surprised her "
    "most was not the noise or the traffic but the loneliness. At home she had known everyone in her street; "
    "here she could go a week without a real conversation. She started small: she said good morning to the "
    "man at the newsagent, joined a Wednesday evening running club and began volunteering at a food bank on "
    "Saturdays. It was awkward at first, and several friendships fizzled out. But after a year she had a "
    "handful of people she could call on a bad day, and she realised that in a big city community is not "
    "something you find but something you slowly build.",
    "Summarise this passage in plain language for someone with no background in finance.\n\n"
    "Exchange-traded funds, or ETFs, are investment funds that are bought and sold on a stock exchange just "
    "like shares of a single company. Most ETFs track an index, such as a list of the largest companies in a "
    "country, by holding all or a representative sample of the shares in that index. Because they simply "
    "follow the index rather than paying managers to pick stocks, their annual fees are usually much lower "
    "than those of traditional funds. This matters over long periods, since even a difference of one per "
    "cent a year can add up to a large sum after several decades. ETFs also make it easy to spread money "
    "across hundreds of companies, reducing the risk of losing a lot if one business fails. However, their "
    "value still rises and falls with the market, and they are not guaranteed to make money.",
)

CHAT = (
    (
        ("user", "I'm planning a trip to Scotland in October. Is that a good time to go?"),
        (
            "assistant",
            "October can be lovely in Scotland, with autumn colours and fewer tourists, though the days are "
            "shorter and the weather is changeable. Pack layers and a waterproof jacket.",
        ),
        ("user", "Which areas would you recommend for a first visit if I have a week?"),
    ),
    (
        ("user", "Can you help me write a Python function to check whether a number is prime?"),
        (
            "assistant",
            "Sure. A simple approach is to check whether any integer from 2 up to the square root of the "
            "number divides it evenly.",
        ),
        ("user", "Great, can you write it and make it handle negative numbers and zero too?"),
    ),
    (
        ("user", "What's a good beginner recipe for dinner tonight? I have chicken, rice and some peppers."),
        ("assistant", "A quick chicken and pepper stir-fry over rice would work well; it takes about 25 minutes."),
        ("user", "Sounds good, but I don't have any soy sauce."),
        (
            "assistant",
            "You can use a little salt with a splash of vinegar and honey, or Worcestershire sauce if you have "
            "it, for a similar savoury-sweet flavour.",
        ),
        ("user", "I have honey and a lemon. Can you give me the full step-by-step recipe using those?"),
    ),
    (
        ("user", "My manager asked me to give a five-minute presentation on our project next week and I'm nervous."),
        (
            "assistant",
            "That's very common. Preparing a simple structure and rehearsing out loud a few times usually "
            "helps a lot with nerves.",
        ),
        ("user", "What structure would you suggest for a short project update?"),
    ),
    (
        ("user", "What's the difference between RAM and storage on a laptop?"),
        (
            "assistant",
            "RAM is short-term working memory used by programs while they run, while storage, like an SSD, "
            "holds your files and apps permanently, even when the power is off.",
        ),
        ("user", "So if my laptop is slow when I have lots of browser tabs open, which one should I upgrade?"),
    ),
    (
        ("user", "I want to start running but I've never really done any exercise."),
        (
            "assistant",
            "A walk-run programme is a great start: alternate one minute of jogging with two minutes of "
            "walking for about twenty minutes, three times a week.",
        ),
        ("user", "How long until I can run for thirty minutes without stopping?"),
        (
            "assistant",
            "Many beginners get there in eight to ten weeks if they lengthen the running intervals gradually "
            "and rest between sessions.",
        ),
        ("user", "What should I do if my knees start to hurt?"),
    ),
    (
        ("user", "Can you explain what a derivative is in calculus?"),
        (
            "assistant",
            "A derivative measures how fast a function's output changes as its input changes. Geometrically, "
            "it is the slope of the tangent line at a point.",
        ),
        ("user", "Could you show me how to find the derivative of x squared from first principles?"),
    ),
    (
        ("user", "I got a parking ticket but the sign was hidden behind a tree. Can I appeal?"),
        (
            "assistant",
            "In many places you can appeal if the signage was unclear or obscured. Taking photos of the sign "
            "and its surroundings as soon as possible will strengthen your case.",
        ),
        ("user", "Could you help me draft a short appeal letter explaining this?"),
    ),
    (
        ("user", "What SQL would I use to get all the orders from the last 7 days?"),
        (
            "assistant",
            "In PostgreSQL you could write: SELECT * FROM orders WHERE created_at >= NOW() - INTERVAL '7 days';",
        ),
        ("user", "How would I write the same thing in MySQL and in SQLite?"),
    ),
    (
        ("user", "I'm trying to pick a name for my new bakery."),
        (
            "assistant",
            "Happy to help! What kind of feel are you going for: cosy and traditional, modern and minimal, or playful?",
        ),
        ("user", "Cosy and traditional. It's in a small seaside town."),
        (
            "assistant",
            "Names that mention the sea or a local landmark often work well, such as 'The Harbour Loaf' or "
            "'Tide and Crumb'.",
        ),
        ("user", "I like those. Can you give me ten more in the same style?"),
    ),
    (
        ("user", "Why do my homemade loaves always come out so dense?"),
        (
            "assistant",
            "Dense bread usually means the dough didn't rise enough, which can be caused by old yeast, too "
            "little kneading or a cold kitchen.",
        ),
        ("user", "My kitchen is quite cold in winter. How can I help the dough rise?"),
    ),
    (
        ("user", "What's a good way to learn Spanish vocabulary quickly?"),
        (
            "assistant",
            "Spaced-repetition flashcards are very effective, especially if you learn words in context and "
            "review them for ten to fifteen minutes every day.",
        ),
        ("user", "Can you give me twenty common Spanish words for travelling, with their English meanings?"),
    ),
    (
        ("user", "How do I undo my last commit in Git but keep the changes?"),
        (
            "assistant",
            "You can run git reset --soft HEAD~1, which removes the commit but leaves your changes staged.",
        ),
        ("user", "What if I've already pushed that commit to a shared branch?"),
    ),
    (
        ("user", "I need to write an email asking my landlord to fix a leaking tap."),
        ("assistant", "Sure. Would you like it to be friendly and informal, or more formal?"),
        ("user", "Friendly but clear. It's been leaking for two weeks."),
        (
            "assistant",
            "Got it. I'll mention how long it has been leaking, ask for a repair date and keep the tone polite.",
        ),
        ("user", "Please also mention that the dripping keeps me awake at night. Go ahead and write it."),
    ),
    (
        ("user", "Who was Ada Lovelace?"),
        (
            "assistant",
            "Ada Lovelace was a nineteenth-century English mathematician who wrote notes on Charles Babbage's "
            "proposed Analytical Engine, including what is often called the first computer program.",
        ),
        ("user", "What exactly did her program calculate?"),
    ),
    (
        ("user", "Is it better to pay for a gym membership or work out at home?"),
        (
            "assistant",
            "It depends on your goals and habits. A gym offers more equipment and a routine, while home "
            "workouts are cheaper and save travel time.",
        ),
        ("user", "I mainly want to get stronger and I have about 40 minutes a day. What would you suggest?"),
    ),
    (
        ("user", "Can you recommend some board games for a family with kids aged 8 and 12?"),
        (
            "assistant",
            "Ticket to Ride, Carcassonne and Dixit are popular choices; they're easy to learn but still "
            "interesting for adults.",
        ),
        ("user", "We've played all of those. Anything a bit more challenging that still takes under an hour?"),
    ),
    (
        ("user", "My JavaScript fetch call keeps failing with a CORS error."),
        (
            "assistant",
            "That usually means the server you're calling doesn't allow requests from your page's origin. It "
            "needs to send an Access-Control-Allow-Origin header.",
        ),
        ("user", "I control the server. It's an Express app."),
        (
            "assistant",
            "Then you can add the cors middleware package, or set the header yourself in a middleware "
            "function registered before your routes.",
        ),
        ("user", "Can you show me both options in code?"),
    ),
    (
        ("user", "What's the capital of Australia?"),
        ("assistant", "The capital of Australia is Canberra, not Sydney as many people assume."),
        ("user", "Why was Canberra chosen instead of Sydney or Melbourne?"),
    ),
    (
        ("user", "I have £5,000 in savings and no debt. What should I do with it?"),
        (
            "assistant",
            "A common approach is to keep three to six months of expenses as an emergency fund in an "
            "easy-access account, then consider investing anything beyond that for the long term.",
        ),
        ("user", "My monthly expenses are about £1,200. How would you split the money?"),
    ),
    (
        ("user", "Can you summarise the plot of Romeo and Juliet?"),
        (
            "assistant",
            "Two young people from feuding families in Verona fall in love and marry in secret, but a chain "
            "of misunderstandings leads to both of their deaths, which finally reconciles the families.",
        ),
        ("user", "What are the main themes that teachers usually focus on?"),
    ),
    (
        ("user", "I'm writing a Bash script and want it to exit as soon as any command fails."),
        (
            "assistant",
            "Add set -e near the top of the script. Many people also use set -euo pipefail to catch unset "
            "variables and failures inside pipes.",
        ),
        ("user", "What does pipefail do exactly?"),
        (
            "assistant",
            "Without it, a pipeline's exit status is that of its last command; with pipefail, the pipeline "
            "fails if any command in it fails.",
        ),
        ("user", "Are there any downsides to relying on set -e?"),
    ),
    (
        ("user", "How long should I boil an egg for a runny yolk?"),
        (
            "assistant",
            "For a large egg lowered into boiling water, about six minutes gives a runny yolk with a set white.",
        ),
        ("user", "And how do I stop the shells from cracking when I put them in?"),
    ),
    (
        ("user", "I keep putting off a big report at work."),
        (
            "assistant",
            "Breaking it into very small tasks, like writing just the outline or a single section, can make "
            "it much easier to start.",
        ),
        ("user", "The report is about our team's carbon footprint. Could you suggest an outline?"),
    ),
    (
        ("user", "What is the difference between a crocodile and an alligator?"),
        (
            "assistant",
            "Alligators have wider, U-shaped snouts, while crocodiles have narrower, V-shaped ones, and a "
            "crocodile's lower teeth stay visible when its mouth is closed.",
        ),
        ("user", "Where in the world can you see both in the wild?"),
    ),
    (
        ("user", "I want to learn to play chess properly."),
        (
            "assistant",
            "A good start is learning basic opening principles: control the centre, develop your knights and "
            "bishops early, and castle to protect your king.",
        ),
        ("user", "I know the rules, but I keep losing pieces in the middle game."),
        (
            "assistant",
            "That often comes from missing tactics. Before each move, check what your opponent is threatening "
            "and whether any of your pieces are undefended.",
        ),
        ("user", "Can you explain forks, pins and skewers with simple examples?"),
    ),
    (
        ("user", "Can you write a haiku about autumn?"),
        ("assistant", "Crisp leaves drift and spin,\namber light on quiet lanes,\nthe year exhales slow."),
        ("user", "Lovely. Now write one about the first snow of winter."),
    ),
    (
        ("user", "What's the best way to clean a cast-iron pan?"),
        (
            "assistant",
            "Rinse it with hot water and scrub with a brush or coarse salt, dry it thoroughly on the hob, "
            "then rub in a thin layer of oil.",
        ),
        ("user", "I left mine wet overnight and now there's rust on it. Is it ruined?"),
    ),
    (
        ("user", "How do I calculate the percentage increase between two numbers?"),
        (
            "assistant",
            "Subtract the old value from the new one, divide the result by the old value, and multiply by 100.",
        ),
        ("user", "My rent went from 950 to 1,040 a month. What's the increase, and is that above typical inflation?"),
    ),
    (
        ("user", "I'm designing a database for a small lending library."),
        (
            "assistant",
            "Good project. You'll probably want tables for books, members and loans, with each loan linking a "
            "member to a book and recording the dates.",
        ),
        ("user", "Should the author just be a column in the books table?"),
        (
            "assistant",
            "If a book can have several authors, it's better to have a separate authors table and a linking "
            "table between books and authors.",
        ),
        ("user", "Can you write the CREATE TABLE statements for all of that in PostgreSQL?"),
    ),
)

KINDS = {
    "question": QUESTION,
    "explain": EXPLAIN,
    "code": CODE,
    "list": LIST,
    "rewrite": REWRITE,
    "summarise": SUMMARISE,
}


def conversations() -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """Every prompt as (label, messages), kinds interleaved (a slice of any length mixes them):
    the label is the kind and its index ("code:7"); messages are (role, text) pairs."""
    kinds: list[tuple[str, tuple[tuple[tuple[str, str], ...], ...]]] = [
        (kind, tuple((("user", text),) for text in texts)) for kind, texts in KINDS.items()
    ]
    kinds.append(("chat", CHAT))
    out = []
    for index in range(max(len(convs) for _, convs in kinds)):
        for kind, convs in kinds:
            if index < len(convs):
                out.append((f"{kind}:{index}", convs[index]))
    return out
