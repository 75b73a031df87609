/* test_jinja.c - the Jinja interpreter against Jinja2 3.1 configured the
 * way transformers configures it: a table of templates covering every
 * supported construct with the exact text Jinja2 renders, error messages
 * with their template line, limits that stop hostile templates, and
 * concurrent renders of one compiled template.
 *
 * The expected texts were produced by Jinja2 3.1.6 (ImmutableSandboxedEnvironment,
 * trim_blocks, lstrip_blocks, loopcontrols, tojson = json.dumps); run
 * `test_jinja --dump | python3 tests/fixtures/check_jinja_cases.py` to
 * check them again against an installed Jinja2. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"
#include "tokenizer/jinja.h"

/* The variables every table case sees. */
static const char *const VARS =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Sys\"},"
    " {\"role\": \"user\", \"content\": \"hi there\"},"
    " {\"role\": \"assistant\", \"content\": \"ok\", \"tool_calls\": [{\"function\":"
    " {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": \"x\"}}}]}],"
    " \"d\": {\"a\": 1, \"b\": [1, 2], \"c\": {\"x\": null}}, \"s\": \"Hello World\", \"n\": null,"
    " \"i\": 7, \"f\": 2.5, \"l\": [3, 1, 2], \"e\": [], \"u\": \"héllo wörld ß\"}";

static const struct {
    const char *tpl, *want;
} cases[] = {
    /* text and output */
    {"Hello {{ s }}!",
     "Hello Hello World!"},
    {"{{ 1, 'a' }}",
     "(1, 'a')"},
    {"{{ none }}|{{ true }}|{{ false }}|{{ None }}|{{ True }}",
     "None|True|False|None|True"},
    {"{{ n }}|{{ i }}|{{ f }}|{{ l }}|{{ d }}|{{ e }}",
     "None|7|2.5|[3, 1, 2]|{'a': 1, 'b': [1, 2], 'c': {'x': None}}|[]"},
    {"{{ [1,'a',none,true,1.5,{'x':(1,)}] }}|{{ (1,) }}|{{ () }}|{{ {} }}|{{ ('a', [1]) }}",
     "[1, 'a', None, True, 1.5, {'x': (1,)}]|(1,)|()|{}|('a', [1])"},
    {"{{ [\"it's\", 'q\"', 'both\\'\"', 'tab\\there', 'nl\\n', 'é', '\\x01', '\\\\'] }}",
     "[\"it's\", 'q\"', 'both\\'\"', 'tab\\there', 'nl\\n', 'é', '\\x01', '\\\\']"},
    /* literals */
    {"{{ 'a\\tb\\\\c\\'d\\\"e\\x41\\101\\u00e9\\U0001F600' }}",
     "a\tb\\c'd\"eAAé😀"},
    {"{{ \"a\" 'b' \"c\" }}|{{ 'it''s' }}",
     "abc|its"},
    {"{{ 9007199254740993 }}|{{ 2**62 }}|{{ 1_000 }}|{{ 0x1F }}|{{ 0b101 }}|{{ 0o17 }}",
     "9007199254740993|4611686018427387904|1000|31|5|15"},
    {"{{ 1.5e3 }}|{{ 1E-2 }}|{{ 1.0 }}|{{ 100.0 }}|{{ 1e100 }}|{{ 3.14 }}|{{ 1_0.5 }}",
     "1500.0|0.01|1.0|100.0|1e+100|3.14|10.5"},
    {"{{ 0.1 + 0.2 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 0.0001 }}|{{ 0.00001 }}|{{ 1/3 }}|{{ -0.0 }}|{{ 2.5e-7 }}|{{ 123456789.123 }}|{{ 12345678901234567.0 }}",
     "0.30000000000000004|1e+16|1000000000000000.0|0.0001|1e-05|0.3333333333333333|-0.0|2.5e-07|123456789.123|1.2345678901234568e+16"},
    {"{{ [1, 2, ] }}|{{ {'a': 1, } }}|{{ (1, 2, ) }}",
     "[1, 2]|{'a': 1}|(1, 2)"},
    /* arithmetic */
    {"{{ 1 + 2 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % -3 }}|{{ 2 ** 10 }}|{{ 7 / 2 }}|{{ 1.5 * 2 }}|{{ 10 / 5 }}",
     "3|3|-4|-2|1024|3.5|3.0|2.0"},
    {"{{ 10 - 2 - 3 }}|{{ 2 * 3 % 4 }}|{{ 7 // 2 * 2 }}|{{ -3 % 5 }}|{{ -3.5 % 2 }}|{{ 3 // -2 }}|{{ -7.5 // 2 }}|{{ 5.0 // 2 }}",
     "5|2|6|2|0.5|-2|-4.0|2.0"},
    {"{{ - 2 ** 2 }}|{{ (-2) ** 2 }}|{{ 2 ** 3 ** 2 }}|{{ 2 ** -1 }}|{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ -i }}|{{ +f }}",
     "4|4|64|0.5|7|9|-7|2.5"},
    {"{{ true + 1 }}|{{ true * 3 }}|{{ 1 + 1.5 }}|{{ 3 - 0.5 }}",
     "2|3|2.5|2.5"},
    {"{{ [1,2] + [3] }}|{{ (1,) + (2,) }}|{{ 'ab' * 3 }}|{{ [0] * 3 }}|{{ 3 * 'x' }}|{{ 'x' * -1 }}|{{ [1] * 0 }}",
     "[1, 2, 3]|(1, 2)|ababab|[0, 0, 0]|xxx||[]"},
    /* an empty sequence repeated a huge number of times (found by fuzz_jinja:
     * the copy loop turned 4 ** 20 times) */
    {"{{ '' * 4 ** 20 }}|{{ [] * 4 ** 20 }}|{{ (0 * [1]) * 2 ** 62 }}|{{ ((), ) * 0 }}",
     "|[]|[]|()"},
    {"{{ 'a' ~ 1 ~ none ~ true ~ [1] }}|{{ 1 ~ (2 + 3) }}|{{ s ~ undefined_var ~ '!' }}",
     "a1NoneTrue[1]|15|Hello World!"},
    /* comparisons and logic */
    {"{{ 1 == 1.0 }}|{{ true == 1 }}|{{ 'a' < 'b' }}|{{ [1,2] < [1,3] }}|{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}|{{ none == none }}|{{ s != 'x' }}",
     "True|True|True|True|True|False|True|True"},
    {"{{ {'a': 1} == {'a': 1} }}|{{ [1, 2] == (1, 2) }}|{{ 1 == '1' }}|{{ undefined_var == undefined_var2 }}|{{ undefined_var == none }}|{{ 2 >= 2.0 }}|{{ 'B' < 'a' }}",
     "True|False|False|True|False|True|True"},
    {"{{ 'a' in 'abc' }}|{{ 1 in l }}|{{ 5 not in l }}|{{ 'a' in d }}|{{ 'z' not in d }}|{{ '' in 's' }}|{{ [1] in [[1]] }}|{{ 'x' in undefined_var }}",
     "True|True|True|True|True|True|True|False"},
    {"{{ true and 'x' }}|{{ false or 'y' }}|{{ not true }}|{{ 0 or '' }}|{{ none or 0 }}|{{ 'a' and 'b' }}|{{ not not 1 }}|{{ not 1 == 2 }}",
     "x|y|False||0|b|True|True"},
    {"{{ 'a' if true else 'b' }}|{{ 'a' if false }}|{{ 'a' if 0 else 'b' if 0 else 'c' }}|{{ (1 if true else 2) + 1 }}",
     "a||c|2"},
    /* attributes and subscripts */
    {"{{ messages[0].role }}|{{ messages[0]['role'] }}|{{ messages[0].nope }}|{{ messages[5] }}|{{ d.c.x }}|{{ d['b'][1] }}|{{ d.b.1 }}|{{ l[-1] }}",
     "system|system|||None|2|2|2"},
    {"{{ s[0] }}|{{ s[-1] }}|{{ s[1:3] }}|{{ s[::-1] }}|{{ s[::2] }}|{{ l[::-1] }}|{{ l[1:] }}|{{ s[:100] }}|{{ u[::-1] }}|{{ u[1:4] }}|{{ l[5:] }}|{{ s[-3:] }}|{{ s[3:1] }}|{{ l[1:-1] }}",
     "H|d|el|dlroW olleH|HloWrd|[2, 1, 3]|[1, 2]|Hello World|ß dlröw olléh|éll|[]|rld||[1]"},
    {"{{ none.x }}|{{ 5.x }}|{{ s.nope }}|{{ none['x'] }}|{{ 'abc'[5] }}|{{ [1][3] }}|{{ {'a':1}['b'] }}|{{ 'abc'['x'] }}|{{ l['x'] }}",
     "||||||||"},
    {"{{ d['items'] is callable }}|{{ {'items': 5}.items is callable }}|{{ {'items': 5}['items'] }}|{{ {'get': 1}.get('get') }}",
     "True|True|5|1"},
    {"{{ messages.append }}|{{ d.update }}|{{ d.pop }}|{{ messages.append is defined }}",
     "|||False"},
    /* whitespace control */
    {"a\n  {% if true %}\n  b\n  {% endif %}\nc",
     "a\n  b\nc"},
    {"a\n  {%- if true -%}\n  b\n  {%- endif %}\nc",
     "abc"},
    {"a\n  {%+ if true %}\n  b\n  {% endif +%}\nc",
     "a\n    b\n\nc"},
    {"  {{ s }}\n  {{- s -}}  \n x",
     "  Hello WorldHello Worldx"},
    {"{% for m in messages %}\n  {{ m.role }}\n{% endfor %}\nend",
     "  system\n  user\n  assistant\nend"},
    {"{# c #}\nx\n  {# c2 #}\ny",
     "x\ny"},
    {"x {# c -#}   \n y {#- c #} z",
     "x y z"},
    {"  {% raw %}  {{ x }}\n  {% endraw %}\nafter",
     "  {{ x }}\nafter"},
    {"  {%- raw -%}  {{ x }}\n  {%- endraw -%}  \nafter",
     "{{ x }}after"},
    {"a  {% if true %}b{% endif %}  c\n  {% if true %}d{% endif %}",
     "a  b  c\nd"},
    {"\n\n  {% set x = 1 %}\n\n{{ x }}\n",
     "\n\n\n1"},
    {"trailing newline\n",
     "trailing newline"},
    {"two trailing\n\n",
     "two trailing\n"},
    {"a\r\nb\rc{{ 'x\r\ny' }}",
     "a\nb\ncx\ny"},
    {"{{- 1 -}}\n \n{{- 2 }}",
     "12"},
    {" \n{% if true %}\nyes\n{% endif %}\n",
     " \nyes\n"},
    {"\t {% if true %}tab{% endif %}",
     "tab"},
    {"x{% if true %}\n{% endif %}y",
     "xy"},
    {"{{ 1 }}\n  {% if true %}z{% endif %}",
     "1\nz"},
    {"{% macro m() -%}\n  inner\n{%- endmacro %}[{{ m() }}]",
     "[inner]"},
    {"{%- set x = 'a' -%}\n\n{{- x -}}\n\n",
     "a"},
    {"{{ '{{' }} {{ '}}' }} {{ '{%' }} {{ {'a': {'b': 1}} }}",
     "{{ }} {% {'a': {'b': 1}}"},
    {"{{-1}}|{{+2}}",
     "1|2"},
    /* if */
    {"{% if messages[0].role == 'system' %}sys{% elif false %}no{% else %}else{% endif %}",
     "sys"},
    {"{% if false %}a{% elif 0 %}b{% elif 'x' %}c{% else %}d{% endif %}",
     "c"},
    {"{% if e %}a{% else %}b{% endif %}{% if d %}c{% endif %}{% if undefined_var %}d{% endif %}{% if 1, %}e{% endif %}",
     "bce"},
    {"{% if true %}{% set q = 1 %}{% endif %}{{ q }}",
     "1"},
    /* for */
    {"{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.depth }}:{{ m.role }}\n"
     "{% endfor %}",
     "1/0/3/2/True/False/3/1:system\n"
     "2/1/2/1/False/False/3/1:user\n"
     "3/2/1/0/False/True/3/1:assistant\n"},
    {"{% for m in messages %}{{ loop.previtem.role if loop.previtem is defined else '-' }}>{{ loop.nextitem.role if loop.nextitem is defined else '-' }};{% endfor %}",
     "->user;system>assistant;user>-;"},
    {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for k, v in d|items %}{{ k }}{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for c in 'abé' %}{{ c }}-{% endfor %}",
     "a=1;b=[1, 2];c={'x': None};|abc|abc|a-b-é-"},
    {"{% for x in e %}x{% else %}empty{% endfor %}|{% for x in undefined_var %}x{% else %}undef{% endfor %}",
     "empty|undef"},
    {"{% for x in l if x > 1 %}{{ x }}{{ loop.index }}{{ loop.length }};{% endfor %}",
     "312;222;"},
    {"{% for x in l %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
     "3"},
    {"{% for x in [1,2] %}{% for y in [3,4] %}{{ loop.index }}{{ x }}{{ y }} {% endfor %}{% endfor %}",
     "113 214 123 224 "},
    {"{% for x in [1,2] %}{% set outer = loop %}{% for y in 'ab' %}{{ outer.index }}{{ loop.index }}{% endfor %}{% endfor %}",
     "11122122"},
    {"{% for x in [[1,[2,3]],[4,[]]] recursive %}<{{ loop.depth }}:{{ x[0] if x is sequence and x[0] is number else x }}{% if x is sequence and x|length > 1 and x[1] is sequence %}{{ loop(x[1]) }}{% endif %}>{% endfor %}",
     "<1:1<2:2><2:3>><1:4>"},
    {"{% for a, (b, c) in [(1, (2, 3))] %}{{ a }}{{ b }}{{ c }}{% endfor %}|{% for x in range(3) %}{{ x }}{% endfor %}",
     "123|012"},
    {"{% for x in l %}{{ loop.cycle('a','b') }}{{ loop.changed(x > 1) }}{% endfor %}",
     "aTruebTrueaTrue"},
    {"{% set x = 1 %}{% for i in [1,2] %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}",
     "12121"},
    {"{% for i in [1,2] %}{% if i == 2 %}{{ y }}{% endif %}{% set y = i %}{% endfor %}[{{ y }}]",
     "[]"},
    {"{% for x in [] %}{% else %}{% set y = 1 %}{% endfor %}[{{ y }}]",
     "[]"},
    {"{% for x in l %}{% endfor %}[{{ x }}]",
     "[]"},
    {"{% for m in messages[::-1] %}{{ m.role }} {% endfor %}",
     "assistant user system "},
    {"{% for x in l|sort %}{{ x }}{% endfor %}|{% for x in l|reverse %}{{ x }}{% endfor %}",
     "123|213"},
    {"{{ loop }}|{% for x in [1] %}{{ loop.nope }}{% endfor %}",
     "|"},
    /* set and namespace */
    {"{% set ns = namespace(c=0) %}{% for x in l %}{% set ns.c = ns.c + x %}{% endfor %}{{ ns.c }}",
     "6"},
    {"{% set x = 5 %}{% for i in l %}{% set x = i %}{% endfor %}{{ x }}",
     "5"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (3, 4) %}{{ t[0] }}{{ t[-1] }}{% set c, d2 = 'xy' %}{{ c }}{{ d2 }}",
     "1234xy"},
    {"{% set blk %}inner {{ s }}{% endset %}[{{ blk }}]",
     "[inner Hello World]"},
    {"{% set blk | upper | replace('I', '1') %}inner {{ s }}{% endset %}[{{ blk }}]",
     "[1NNER HELLO WORLD]"},
    {"{% set ns = namespace() %}{% set ns.a = 1 %}{{ ns.a }}{{ ns.b }}{{ ns }}{{ ns['a'] }}",
     "1<Namespace {'a': 1}>1"},
    {"{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}",
     "12"},
    {"{% set ns = namespace(x=none) %}{% set ns.x = [1] + ns.x if ns.x else [1] %}{{ ns.x }}",
     "[1]"},
    {"{% set messages = messages[1:] %}{{ messages|length }}",
     "2"},
    {"{% set x = 1, 2 %}{{ x }}",
     "(1, 2)"},
    /* macro, call, caller */
    {"{% macro m(a, b=2, c='x') %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|{{ m(1, c='z') }}|{{ m(a=9) }}|{{ m() }}",
     "1-2-x|1-3-x|1-2-z|9-2-x|-2-x"},
    {"{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}|{{ m() }}",
     "1(2, 3){'k': 4}|(){}"},
    {"{% macro m() %}<{{ caller() }}>{% endmacro %}{% call m() %}body {{ s }}{% endcall %}",
     "<body Hello World>"},
    {"{% macro m(x) %}[{{ caller(x * 2) }}]{% endmacro %}{% call(v) m(21) %}v={{ v }}{% endcall %}",
     "[v=42]"},
    {"{% macro m(a, b=a * 2) %}{{ b }}{% endmacro %}{{ m(3) }}",
     "6"},
    {"{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}",
     "120"},
    {"{% macro m() %}{% set w = 3 %}{{ w }}{% endmacro %}{{ m() }}[{{ w }}]",
     "3[]"},
    {"{% macro m() %}{{ z }}{% endmacro %}{% set z = 5 %}{{ m() }}",
     "5"},
    {"{% for i in [1,2] %}{% macro m() %}[{{ i }}]{% endmacro %}{{ m() }}{% endfor %}",
     "[1][2]"},
    {"{% macro m() %}[{{ i }}]{% endmacro %}{% for i in [1,2] %}{{ m() }}{% endfor %}",
     "[7][7]"},
    {"{% macro m(x) %}{{ x }}{% endmacro %}{{ m }}|{{ m is callable }}|{{ m('a') ~ m('b') }}",
     "<Macro 'm'>|True|ab"},
    {"{% macro m() %}x{% endmacro %}{{ m()|length }}{{ m() is string }}",
     "1True"},
    /* filter and with blocks */
    {"{% filter upper %}abc {{ s }}{% endfilter %}",
     "ABC HELLO WORLD"},
    {"{% filter replace('a', 'b')|upper %}aaa{% endfilter %}",
     "BBB"},
    {"{% filter upper %}{% set q = 1 %}a{% endfilter %}[{{ q }}]",
     "A[]"},
    {"{% with x = 1, y = 2 %}{{ x + y }}{% endwith %}[{{ x }}]",
     "3[]"},
    {"{% set a = 5 %}{% with a = 1, b = a %}{{ a }}{{ b }}{% endwith %}",
     "15"},
    /* tests */
    {"{{ s is string }}{{ n is none }}{{ d is mapping }}{{ l is iterable }}{{ l is sequence }}{{ i is number }}{{ i is integer }}{{ f is float }}{{ true is boolean }}",
     "TrueTrueTrueTrueTrueTrueTrueTrueTrue"},
    {"{{ undefined_var is defined }}{{ undefined_var is undefined }}{{ s is defined }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}",
     "FalseTrueTrueTrueTrueTrueFalse"},
    {"{{ 1 is in l }}{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ 'aB' is lower }}{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 0 is false }}",
     "TrueTrueTrueFalseTrueFalseTrueFalse"},
    {"{{ 1 is eq 1 }}{{ 1 is equalto 2 }}{{ 2 is gt 1 }}{{ 2 is lessthan 1 }}{{ 1 is ne 1 }}{{ 2 is ge 2 }}{{ 2 is le 1 }}{{ 1 is lt 2 }}{{ 1 is greaterthan 0 }}",
     "TrueFalseTrueFalseFalseTrueFalseTrueTrue"},
    {"{{ none is sameas none }}{{ true is sameas true }}{{ 1 is sameas 1 }}{{ l is sameas l }}{{ [] is sameas [] }}",
     "TrueTrueTrueTrueFalse"},
    {"{{ s is iterable }}{{ d is iterable }}{{ 5 is iterable }}{{ s is sequence }}{{ d is sequence }}{{ 5 is sequence }}{{ s is mapping }}{{ n is string }}",
     "TrueTrueFalseTrueTrueFalseFalseFalse"},
    {"{{ 'upper' is filter }}{{ 'nope' is filter }}{{ 'odd' is test }}{{ l is not none }}{{ 1.0 is integer }}{{ true is number }}{{ true is integer }}",
     "TrueFalseTrueTrueFalseTrueFalse"},
    {"{{ messages[0].content is defined }}{{ messages[0].tool_calls is defined }}{{ messages[2].tool_calls is not none }}{{ range is callable }}",
     "TrueFalseTrueTrue"},
    /* filters */
    {"{{ s|length }}{{ u|length }}{{ l|length }}{{ d|length }}{{ s|count }}{{ undefined_var|length }}",
     "111333110"},
    {"{{ s|upper }}|{{ s|lower }}|{{ 'hello world'|capitalize }}|{{ 'hello wORLD-foo(bar'|title }}|{{ u|upper }}|{{ 'ÀÉÎ'|lower }}|{{ 'straße'|upper }}",
     "HELLO WORLD|hello world|Hello world|Hello World-Foo(Bar|HÉLLO WÖRLD SS|àéî|STRASSE"},
    {"{{ '  x  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ s|replace('o', '0') }}|{{ s|replace('o', '0', 1) }}|{{ 'abc'|replace('', '-') }}|{{ 5|replace('5', 'five') }}",
     "x|hi|Hell0 W0rld|Hell0 World|-a-b-c-|five"},
    {"{{ n|default('dflt') }}|{{ undefined_var|default('dflt') }}|{{ ''|default('dflt', true) }}|{{ 0|d('z', boolean=true) }}|{{ undefined_var|d }}|{{ none|d('x', true) }}",
     "None|dflt|dflt|z||x"},
    {"{{ l|join(',') }}|{{ l|join }}|{{ messages|map(attribute='role')|join(', ') }}|{{ messages|join('|', attribute='role') }}",
     "3,1,2|312|system, user, assistant|system|user|assistant"},
    {"{{ l|sort|join }}|{{ l|sort(reverse=true)|join }}|{{ ['b','A','a','B']|sort }}|{{ ['b','A','a','B']|sort(case_sensitive=true) }}|{{ ['a','A','b']|unique|list }}|{{ ['a','A']|unique(case_sensitive=true)|list }}",
     "123|321|['A', 'a', 'b', 'B']|['A', 'B', 'a', 'b']|['a', 'b']|['a', 'A']"},
    {"{{ [{'a':2,'b':1},{'a':1,'b':2}]|sort(attribute='a')|map(attribute='b')|list }}|{{ [{'a':2,'b':1},{'a':1,'b':2}]|sort(attribute='b,a') }}|{{ [3,1,2]|sort(attribute='0') }}",
     "[2, 1]|[{'a': 2, 'b': 1}, {'a': 1, 'b': 2}]|[3, 1, 2]"},
    {"{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|{{ messages|rejectattr('role', 'eq', 'user')|map(attribute='role')|list }}|{{ messages|selectattr('tool_calls')|list|length }}|{{ messages|selectattr('tool_calls', 'defined')|map(attribute='role')|first }}",
     "1|['system', 'assistant']|1|assistant"},
    {"{{ messages|map(attribute='nope', default='D')|list }}|{{ messages[2:]|map(attribute='tool_calls.0.function.name')|list }}|{{ messages|selectattr('role', 'in', ['user', 'system'])|map(attribute='role')|list }}",
     "['D', 'D', 'D']|['f']|['system', 'user']"},
    {"{{ l|first }}{{ l|last }}{{ s|first }}{{ s|last }}{{ e|first }}|{{ l|min }}{{ l|max }}{{ l|sum }}|{{ ['b','A']|min }}|{{ messages|sum(attribute='nope', start=0) if false else 0 }}|{{ [[1],[2]]|sum(start=[]) }}",
     "32Hd|136|A|0|[1, 2]"},
    {"{{ d|tojson }}|{{ messages[2]|tojson }}|{{ 'é\"\\n\\t\\u0001<>&\\''|tojson }}|{{ [1.0, 2.5, 1e20, none, true, -0.0]|tojson }}|{{ ''|tojson }}|{{ {}|tojson(indent=2) }}|{{ []|tojson(indent=2) }}",
     "{\"a\": 1, \"b\": [1, 2], \"c\": {\"x\": null}}|{\"role\": \"assistant\", \"content\": \"ok\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": \"x\"}}}]}|\"é\\\"\\n\\t\\u0001<>&'\"|[1.0, 2.5, 1e+20, null, true, -0.0]|\"\"|{}|[]"},
    {"{{ d|tojson(indent=2) }}",
     "{\n"
     "  \"a\": 1,\n"
     "  \"b\": [\n"
     "    1,\n"
     "    2\n"
     "  ],\n"
     "  \"c\": {\n"
     "    \"x\": null\n"
     "  }\n"
     "}"},
    {"{{ d|tojson(indent=4) }}|{{ [1,[2,{'a':[]}]]|tojson(indent=1) }}|{{ d|tojson(indent='\\t') }}|{{ l|tojson(indent=0) }}",
     "{\n"
     "    \"a\": 1,\n"
     "    \"b\": [\n"
     "        1,\n"
     "        2\n"
     "    ],\n"
     "    \"c\": {\n"
     "        \"x\": null\n"
     "    }\n"
     "}|[\n"
     " 1,\n"
     " [\n"
     "  2,\n"
     "  {\n"
     "   \"a\": []\n"
     "  }\n"
     " ]\n"
     "]|{\n"
     "\t\"a\": 1,\n"
     "\t\"b\": [\n"
     "\t\t1,\n"
     "\t\t2\n"
     "\t],\n"
     "\t\"c\": {\n"
     "\t\t\"x\": null\n"
     "\t}\n"
     "}|[\n"
     "3,\n"
     "1,\n"
     "2\n"
     "]"},
    {"{{ {'b':1,'a':2}|tojson(sort_keys=true) }}|{{ 'é'|tojson(ensure_ascii=true) }}|{{ '😀'|tojson(true) }}|{{ d|tojson(separators=(',', ':')) }}|{{ {1: 'a', 2.5: 'b', true: 'c', none: 'd'}|tojson }}",
     "{\"a\": 2, \"b\": 1}|\"\\u00e9\"|\"\\ud83d\\ude00\"|{\"a\":1,\"b\":[1,2],\"c\":{\"x\":null}}|{\"1\": \"c\", \"2.5\": \"b\", \"null\": \"d\"}"},
    {"{{ range(5)|list }}|{{ range(1, 10, 3)|list }}|{{ range(5, 0, -2)|list }}|{{ range(3) }}|{{ range(0)|list }}|{{ range(1, 7, 2) }}",
     "[0, 1, 2, 3, 4]|[1, 4, 7]|[5, 3, 1]|range(0, 3)|[]|range(1, 7, 2)"},
    {"{{ l|reverse|list }}|{{ s|reverse }}|{{ u|reverse }}|{{ l|batch(2)|list }}|{{ l|slice(2)|list }}|{{ [1,2,3,4,5]|batch(2, 0)|list }}|{{ [1,2,3,4]|slice(3, 'x')|list }}",
     "[2, 1, 3]|dlroW olleH|ß dlröw olléh|[[3, 1], [2]]|[[3, 1], [2]]|[[1, 2], [3, 4], [5, 0]]|[[1, 2], [3, 'x'], [4, 'x']]"},
    {"{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb\\n\\nc'|indent(2, true) }}|{{ 'a\\nb\\n\\nc'|indent('> ', blank=true) }}|{{ 'x'|indent(first=true) }}",
     "a\n    b\n\n    c|  a\n  b\n\n  c|a\n> b\n> \n> c|    x"},
    {"{{ 'one two  three_4 é'|wordcount }}|{{ 42|string }}|{{ '42'|int + 1 }}|{{ '4.7'|int }}|{{ 'x'|int(7) }}|{{ '0x1A'|int(0, 16) }}|{{ '3.5'|float }}|{{ 3|float }}|{{ 'nan'|float }}|{{ 'x'|float(1.5) }}",
     "4|42|43|4|7|26|3.5|3.0|nan|1.5"},
    {"{{ -5|abs }}|{{ -2.5|abs }}|{{ 2.567|round(2) }}|{{ 2.5|round }}|{{ 3.5|round }}|{{ 2.1|round(method='ceil') }}|{{ 2.9|round(0, 'floor') }}|{{ 5|round }}|{{ 1234|round(-2) }}|{{ 2.675|round(2) }}",
     "5|2.5|2.57|2.0|4.0|3.0|2.0|5|1200|2.67"},
    {"{{ '<a href=\"x\">&\\''|escape }}|{{ '<b>'|e }}|{{ 5|safe }}|{{ 'abc'|center(9) }}|{{ 'abcdefghij'|truncate(7) }}|{{ 'hello world foo bar'|truncate(12) }}|{{ 'hello world'|truncate(8, true) }}",
     "&lt;a href=&#34;x&#34;&gt;&amp;&#39;|&lt;b&gt;|5|   abc   |abcdefghij|hello...|hello world"},
    {"{{ l|map('string')|join('+') }}|{{ ['a','b']|map('upper')|list }}|{{ l|select('odd')|list }}|{{ l|reject('odd')|list }}|{{ [0,1,'',none,'x']|select|list }}|{{ l|select('gt', 1)|list }}|{{ ['a','b']|map('replace', 'a', 'z')|list }}",
     "3+1+2|['A', 'B']|[3, 1]|[2]|[1, 'x']|[3, 2]|['z', 'b']"},
    {"{{ {'b':2,'a':1}|dictsort }}|{{ {'b':2,'a':1}|dictsort(by='value', reverse=true) }}|{{ d|items|list }}|{{ undefined_var|items|list }}|{{ d|list }}|{{ 'ab'|list }}|{{ d|first }}|{{ d|last }}",
     "[('a', 1), ('b', 2)]|[('b', 2), ('a', 1)]|[('a', 1), ('b', [1, 2]), ('c', {'x': None})]|[]|['a', 'b', 'c']|['a', 'b']|a|c"},
    {"{{ messages|selectattr('role', 'eq', 'nobody')|list }}|{{ (messages|selectattr('role','eq','user')|first).content }}|{{ messages|map(attribute='role')|unique|list }}",
     "[]|hi there|['system', 'user', 'assistant']"},
    {"{{ '%s-%d-%.2f-%5s-%-5s|' % ('a', 3, 2.5, 'x', 'y') }}{{ '%s' % 'z' }}{{ '%(a)s' % {'a': 1} }}{{ '%05d|%x|%o|%+d|%X|%#x' % (42, 255, 8, 5, 255, 255) }}|{{ '%s and %s'|format('a', 'b') }}|{{ '%(x)s'|format(x=1) }}|{{ '%%|%r' % ('q',) }}",
     "a-3-2.50-    x-y    |z100042|ff|10|+5|FF|0xff|a and b|1|%|'q'"},
    {"{{ s|attr('upper') is callable }}|{{ d|attr('a') }}|{{ d|attr('items') is defined }}",
     "True||True"},
    /* str methods */
    {"{{ s.startswith('He') }}{{ s.endswith('ld') }}{{ s.startswith(('x','H')) }}{{ s.startswith('lo', 3) }}{{ s.endswith('Wor', 0, 9) }}",
     "TrueTrueTrueTrueTrue"},
    {"{{ s.split() }}{{ s.split('o') }}{{ s.split('o', 1) }}{{ s.rsplit('o', 1) }}{{ '  a  b  '.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a b c'.split(None, 1) }}{{ ' a b c '.rsplit(None, 1) }}{{ 'a.b.c'.rsplit('.', 1) }}{{ ''.split() }}{{ ''.split(',') }}",
     "['Hello', 'World']['Hell', ' W', 'rld']['Hell', ' World']['Hello W', 'rld']['a', 'b']['a', 'b', '', 'c']['a', 'b c'][' a b', 'c']['a.b', 'c'][]['']"},
    {"{{ 'a\\nb\\r\\nc\\n'.splitlines() }}|{{ '  x  '.strip() }}|{{ '\\n\\nx\\n'.lstrip('\\n') }}|{{ 'x\\n\\n'.rstrip('\\n') }}|{{ 'abcxa'.strip('ax') }}|{{ '\\u3000x\\xa0'.strip() }}",
     "['a', 'b', 'c']|x|x\n|x|bc|x"},
    {"{{ s.upper() }}{{ s.lower() }}{{ s.title() }}{{ \"they're bill's\"|title }}{{ \"they're bill's\".title() }}{{ 'aB'.swapcase() }}{{ 'hELLO'.capitalize() }}{{ 'ὈΔΥΣΣΕΎΣ'|lower }}",
     "HELLO WORLDhello worldHello WorldThey're Bill'sThey'Re Bill'SAbHelloὀδυσσεύς"},
    {"{{ s.find('o') }}{{ s.rfind('o') }}{{ s.find('z') }}{{ s.count('o') }}{{ s.replace('l', 'L') }}{{ s.replace('l', 'L', 2) }}{{ '-'.join(['a','b']) }}{{ s.index('W') }}{{ u.find('w') }}{{ s.find('o', 5) }}{{ 'aaa'.count('') }}",
     "47-12HeLLo WorLdHeLLo Worlda-b6674"},
    {"{{ 'ABC'.lower() is lower }}{{ '123' is lower }}{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ '  '.isspace() }}{{ 'a1'.isalnum() }}{{ 'Ab'.isupper() }}{{ 'x'.zfill(3) }}{{ '-5'.zfill(4) }}",
     "TrueFalseTrueTrueTrueTrueFalse00x-005"},
    {"{{ 'abc'.ljust(5) }}|{{ 'abc'.rjust(5, '*') }}|{{ 'abc'.center(6, '-') }}|{{ 'prefix_x'.removeprefix('prefix_') }}|{{ 'a.txt'.removesuffix('.txt') }}|{{ 'a=b=c'.partition('=') }}|{{ 'a=b=c'.rpartition('=') }}|{{ 'abc'.partition('z') }}",
     "abc  |**abc|-abc--|x|a|('a', '=', 'b=c')|('a=b', '=', 'c')|('abc', '', '')"},
    {"{{ '{} and {}'.format(1, 'x') }}|{{ '{0}{1}{0}'.format('a','b') }}|{{ '{name}!'.format(name='z') }}|{{ '{:>5}|{:<4}|{:^6}|{:05d}|{:.2f}|{:,}|{:x}|{!r}'.format('a', 'b', 'c', 42, 3.14159, 1234567, 255, 'q') }}|{{ '{0[0]}{1.role}'.format(l, messages[0]) if false else '' }}|{{ '{{}}{}'.format(1) }}",
     "1 and x|aba|z!|    a|b   |  c   |00042|3.14|1,234,567|ff|'q'||{}1"},
    /* dict and list methods, globals */
    {"{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 5) }}{{ d.keys() }}{{ d.values() }}{{ d.items() }}{{ d.keys()|list }}{{ d.copy() }}",
     "1None5dict_keys(['a', 'b', 'c'])dict_values([1, [1, 2], {'x': None}])dict_items([('a', 1), ('b', [1, 2]), ('c', {'x': None})])['a', 'b', 'c']{'a': 1, 'b': [1, 2], 'c': {'x': None}}"},
    {"{{ l.index(2) }}{{ l.count(3) }}{{ (1,2).index(2) }}{{ (1,1).count(1) }}{{ l.copy() }}",
     "2112[3, 1, 2]"},
    {"{{ dict(a=1, b=2) }}{{ dict({'x': 1}, y=2) }}{{ dict([('k', 'v')]) }}{{ namespace(x=1).x }}{{ dict(a=1)|tojson }}",
     "{'a': 1, 'b': 2}{'x': 1, 'y': 2}{'k': 'v'}1{\"a\": 1}"},
    {"{% set j = joiner(', ') %}{% for x in l %}{{ j() }}{{ x }}{% endfor %}|{% set j2 = joiner() %}{{ j2() }}{{ j2() }}",
     "3, 1, 2|, "},
    {"{{ range(3)|length }}{{ range(10)[2] }}{{ range(10)[-1] }}{{ 2 in range(3) }}",
     "329True"},
    /* lazy generators and constant folding */
    {"{% if ' x '|select('odd') %}y{% endif %}|{{ [1, 'a']|select('odd')|first }}|{{ (5|items) is defined }}|{{ 2.5|map('upper')|rejectattr('x') is defined }}",
     "y|1|True|True"},
    {"{{ none[::-1] }}|{{ 1[1:] is defined }}|{{ 'abc'[1:] }}|{{ [1e3[1:2]]|length if false else 'k' }}",
     "|False|bc|k"},
    /* undefined */
    {"{{ undefined_var }}|{{ undefined_var ~ 'a' }}|{{ undefined_var|length }}|{% for x in undefined_var %}x{% endfor %}|{{ undefined_var|list }}|{{ undefined_var|upper }}|{{ undefined_var|trim }}|{{ undefined_var|string }}|{{ not undefined_var }}",
     "|a|0||[]||||True"},
    {"{{ [undefined_var] }}|{{ undefined_var is iterable }}|{{ undefined_var is sequence }}|{{ undefined_var|first }}|{{ undefined_var|join(',') }}|{{ undefined_var|default(none) }}",
     "[Undefined]|True|True|||None"},
    {"{{ messages[0].nope|default('d') }}|{{ messages[0].nope is none }}|{{ messages[9] is defined }}|{{ (messages|last).nope|length }}",
     "d|False|False|0"},
};

/* Templates Jinja2 rejects too; `err` is a substring of cllm's message. */
static const struct {
    const char *tpl, *err;
} errors[] = {
    {"{{ foo|nofilter }}",
     "template line 1: unknown filter 'nofilter'"},
    {"line1\n{{ x is nosuchtest }}",
     "template line 2: unknown test 'nosuchtest'"},
    {"{% if x %}\nabc",
     "template line 2: unexpected end of template: expected 'elif' or 'else' or 'endif' to close the 'if' on line 1"},
    {"a\n{% endfor %}",
     "template line 2: unexpected 'endfor'"},
    {"{% foo %}",
     "template line 1: unknown tag 'foo'"},
    {"{{ 1 + }}",
     "template line 1: unexpected 'end of print statement'"},
    {"{{ 'abc }}",
     "template line 1: unterminated string"},
    {"x\n{# never closed",
     "template line 2: missing end of comment tag"},
    {"{{ a b }}",
     "template line 1: expected end of print statement, got 'b'"},
    {"{% for x in %}{% endfor %}",
     "template line 1: expected an expression"},
    {"{{ (1 }}",
     "template line 1: unexpected '}', expected ')'"},
    {"{% set 1 = 2 %}",
     "can't assign"},
    {"{% break %}",
     "template line 1: 'break' outside of a loop"},
    {"{% macro m(a=1, b) %}{% endmacro %}",
     "non-default argument follows default argument"},
    {"{% include 'x.j2' %}",
     "'include' is not supported"},
    {"{{ 'a' ! 'b' }}",
     "unexpected character '!'"},
    {"\n\n{{ raise_exception('Conversation roles must alternate') }}",
     "template line 3: Conversation roles must alternate"},
    {"{{ x.y }}",
     "template line 1: 'x' is undefined"},
    {"{{ d.zz.yy }}",
     "template line 1: 'dict object' has no attribute 'zz'"},
    {"{{ messages[9].role }}",
     "list object has no element 9"},
    {"{{ undefined_var + 1 }}",
     "'undefined_var' is undefined"},
    {"{{ undefined_var() }}",
     "'undefined_var' is undefined"},
    {"{{ 1 / 0 }}",
     "division by zero"},
    {"{{ 1 // 0 }}",
     "integer division or modulo by zero"},
    {"{{ 1 + 'a' }}",
     "unsupported operand type(s) for +: 'int' and 'str'"},
    {"{{ 'a' + 1 }}",
     "can only concatenate str (not \"int\") to str"},
    {"{{ 1 < 'a' }}",
     "'<' not supported between instances of 'int' and 'str'"},
    {"{{ undefined_var|tojson }}",
     "Object of type Undefined is not JSON serializable"},
    {"{{ messages.append(1) }}",
     "access to attribute 'append' of 'list' object is unsafe."},
    {"{{ d.update({'x': 1}) }}",
     "access to attribute 'update' of 'dict' object is unsafe."},
    {"{{ s() }}",
     "'str' object is not callable"},
    {"{% for a, b in [[1,2],[3]] %}{% endfor %}",
     "not enough values to unpack (expected 2, got 1)"},
    {"{% set a, b = [1,2,3] %}",
     "too many values to unpack (expected 2)"},
    {"{{ range(200000)|length }}",
     "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000)."},
    {"{% set x = 1 %}{% set x.y = 2 %}",
     "cannot assign attribute on non-namespace object"},
    {"{{ [1, 'a']|sort }}",
     "'<' not supported between instances of 'str' and 'int'"},
    {"{{ none|length }}",
     "object of type 'NoneType' has no len()"},
    {"{% for x in 5 %}{% endfor %}",
     "'int' object is not iterable"},
    {"{{ messages|selectattr('role')|length }}",
     "object of type 'generator' has no len()"},
    {"{{ 5|items|list }}",
     "Can only get item pairs from a mapping."},
    {"{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}",
     "macro 'm' takes not more than 1 argument(s)"},
    {"{% macro m(a) %}{% endmacro %}{{ m(b=2) }}",
     "macro 'm' takes no keyword argument 'b'"},
    {"{{ 'x'.split('') }}",
     "empty separator"},
    {"{{ 'abc'.index('z') }}",
     "substring not found"},
    {"{{ i[1:] }}",
     "'int' object is not subscriptable"},
    {"{{ d[1:] }}",
     "unhashable type: 'slice'"},
    {"{% set ns = namespace(a=true[::-1]) %}",
     "'bool' object is not subscriptable"},
    {"{{ [1, 'a']|select('odd')|list }}",
     "not all arguments converted during string formatting"},
    {"{{ 007 }}",
     "expected end of print statement, got 'integer'"},
    {"{{ 'a' ~ 1 + 2 }}",
     "can only concatenate str (not \"int\") to str"},
    {"{{ messages|map(attribute='tool_calls.0.function.name')|list }}",
     "'dict object' has no attribute 'tool_calls'"},
    {"{{ {[1]: 2} }}",
     "unhashable type: 'list'"},
    {"{{ '%d' % 'x' }}",
     "%d format: a real number is required, not str"},
    {"{{ '%s %s' % ('a',) }}",
     "not enough arguments for format string"},
    {"{{ x }}\n{% for i in l %}\n{{ i.a.b }}\n{% endfor %}",
     "template line 3: 'int object' has no attribute 'a'"},
    {"{{ l|round }}",
     "type list doesn't define __round__ method"},
};

/* Renders src with vars (JSON text, NULL: none); returns the text or NULL
 * with the message in e. */
static char *render(const char *src, const char *vars, const struct jinja_render_opts *o,
                    struct err *e)
{
    struct jinja_template *t = jinja_compile(src, strlen(src), e);
    if (!t)
        return NULL;
    json_t *v = NULL;
    if (vars) {
        json_error_t je;
        v = json_loads(vars, 0, &je);
        if (!v) {
            snprintf(e->msg, sizeof e->msg, "bad test vars: %s", je.text);
            jinja_free(t);
            return NULL;
        }
    }
    size_t len;
    char *out = jinja_render(t, v, o, &len, e);
    if (out && strlen(out) != len) {
        snprintf(e->msg, sizeof e->msg, "length %zu but strlen %zu", len, strlen(out));
        free(out);
        out = NULL;
    }
    json_decref(v);
    jinja_free(t);
    return out;
}

static void expect(const char *src, const char *vars, const char *want)
{
    struct err e = {{0}};
    char *out = render(src, vars, NULL, &e);
    CHECK(out && !strcmp(out, want), "template %s\n  want: %s\n  got:  %s", src, want,
          out ? out : e.msg);
    free(out);
}

static void expect_err(const char *src, const char *vars, const struct jinja_render_opts *o,
                       const char *want)
{
    struct err e = {{0}};
    char *out = render(src, vars, o, &e);
    CHECK(!out && strstr(e.msg, want), "template %.200s\n  want error: %s\n  got: %s", src, want,
          out ? out : e.msg);
    free(out);
}

/* Behaviour Jinja2's table cannot show: transformers' extensions, the
 * clock, and where cllm deliberately differs from Python. */
static void test_extras(void)
{
    expect("{% generation %}gen {{ s }}{% endgeneration %}", VARS, "gen Hello World");
    expect("{% generation %}{% set q = 1 %}{% endgeneration %}[{{ q }}]", VARS, "[]");
    struct jinja_render_opts o = {.now = 1700000000}; /* 2023-11-14 22:13:20 UTC */
    struct err e = {{0}};
    char *out = render("{{ strftime_now('%Y-%m-%d %H:%M') }}|{{ strftime_now('%d %b %Y') }}",
                       NULL, &o, &e);
    CHECK(out && !strcmp(out, "2023-11-14 22:13|14 Nov 2023"), "strftime_now: %s", out ? out : e.msg);
    free(out);
    /* variables shadow globals, as in Jinja2 */
    expect("{{ range }}|{{ namespace is defined }}", "{\"range\": 5}", "5|True");
    /* Python integers are unbounded; cllm's are 64-bit and say so */
    expect_err("{{ 2 ** 64 }}", NULL, NULL, "integer overflow");
    expect_err("{{ 9223372036854775807 + 1 }}", NULL, NULL, "integer overflow");
    expect("{{ 9223372036854775807 }}|{{ -9223372036854775807 - 1 }}", NULL,
           "9223372036854775807|-9223372036854775808");
    /* no variables at all */
    expect("{{ messages }}|{{ 1 }}", NULL, "|1");
    /* a JSON object's key order is kept (jansson keeps insertion order) */
    expect("{{ o|tojson }}|{% for k in o %}{{ k }}{% endfor %}",
           "{\"o\": {\"z\": 1, \"a\": 2, \"m\": {\"y\": 1, \"b\": 2}}}",
           "{\"z\": 1, \"a\": 2, \"m\": {\"y\": 1, \"b\": 2}}|zam");
    /* JSON numbers keep their kind: 1 stays int, 1.0 stays float */
    expect("{{ [a, b, c]|tojson }}|{{ a }} {{ b }} {{ c }}", "{\"a\": 1, \"b\": 1.0, \"c\": 1e20}",
           "[1, 1.0, 1e+20]|1 1.0 1e+20");
}

static void test_api_errors(void)
{
    struct err e = {{0}};
    CHECK(!jinja_compile("{{ '\xff' }}", 8, &e) && strstr(e.msg, "UTF-8"), "invalid UTF-8: %s", e.msg);
    struct jinja_template *t = jinja_compile("x", 1, &e);
    CHECK(t != NULL, "compile x: %s", e.msg);
    json_t *arr = json_array();
    size_t len;
    char *out = jinja_render(t, arr, NULL, &len, &e);
    CHECK(!out && strstr(e.msg, "JSON object"), "vars must be an object: %s", e.msg);
    free(out);
    json_decref(arr);
    jinja_free(t);
    jinja_free(NULL);
    /* an empty template renders an empty string */
    t = jinja_compile("", 0, &e);
    out = t ? jinja_render(t, NULL, NULL, &len, &e) : NULL;
    CHECK(out && len == 0 && out[0] == 0, "empty template: %s", out ? out : e.msg);
    free(out);
    jinja_free(t);
}

/* Hostile templates stop with an error instead of hanging or crashing. */
static void test_limits(void)
{
    struct jinja_render_opts o = {.limits = {.max_steps = 100000}};
    expect_err("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
               NULL, &o, "steps");
    expect_err("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
               NULL, NULL, "steps (endless loop?)");
    expect_err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, NULL,
               "macro calls nest more than 100 deep");
    struct jinja_render_opts shallow = {.limits = {.max_call_depth = 5}};
    expect_err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, &shallow,
               "more than 5 deep");
    expect_err("{% for x in [[1]] recursive %}{{ loop([x]) }}{% endfor %}", NULL, NULL,
               "recursive loops nest more than 100 deep");
    expect_err("{{ 'x' * 100000000 }}", NULL, NULL, "longer than");
    struct jinja_render_opts small = {.limits = {.max_output = 1000}};
    expect_err("{% for i in range(2000) %}x{% endfor %}", NULL, &small, "longer than 1000 bytes");
    struct jinja_render_opts mem = {.limits = {.max_memory = 1 << 20}};
    expect_err("{% set ns = namespace(s='') %}{% for i in range(10000) %}"
               "{% set ns.s = ns.s ~ 'xxxxxxxxxxxxxxxx' %}{% endfor %}{{ ns.s|length }}",
               NULL, &mem, "more than 1 MiB of memory");
    /* deep nesting is refused by the parser (bounded C stack) */
    char deep[2000];
    int k = 0;
    k += sprintf(deep + k, "{{ ");
    for (int i = 0; i < 300; i++)
        deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 300; i++)
        deep[k++] = ')';
    strcpy(deep + k, " }}");
    expect_err(deep, NULL, NULL, "too deeply");
    k = 0;
    k += sprintf(deep + k, "{{ ");
    for (int i = 0; i < 120; i++)
        k += sprintf(deep + k, "[");
    for (int i = 0; i < 120; i++)
        k += sprintf(deep + k, "]");
    strcpy(deep + k, " }}");
    expect_err(deep, NULL, NULL, "template nests too deeply (more than 100 levels)");
    k = 0;
    for (int i = 0; i < 150; i++)
        k += sprintf(deep + k, "{%% if 1 %%}");
    expect_err(deep, NULL, NULL, "nests too deeply");
    /* a long left-leaning chain parses but stays within the evaluator's depth */
    char *chain = malloc(40000);
    k = sprintf(chain, "{{ 0");
    for (int i = 0; i < 5000; i++)
        k += sprintf(chain + k, " + 1");
    strcpy(chain + k, " }}");
    expect_err(chain, NULL, NULL, "expression nests too deeply");
    k = sprintf(chain, "{{ 0");
    for (int i = 0; i < 500; i++)
        k += sprintf(chain + k, " + 1");
    strcpy(chain + k, " }}");
    expect(chain, NULL, "500");
    free(chain);
    /* a namespace that contains itself can be printed without looping */
    expect_err("{% set ns = namespace() %}{% set ns.me = [ns] %}{{ ns }}", NULL, NULL,
               "nests too deeply");
}

struct thread_arg {
    const struct jinja_template *t;
    json_t *vars;
    const char *want;
    int ok;
};

static void *render_many(void *p)
{
    struct thread_arg *a = p;
    for (int i = 0; i < 200; i++) {
        struct err e = {{0}};
        size_t len;
        char *out = jinja_render(a->t, a->vars, NULL, &len, &e);
        a->ok += out && !strcmp(out, a->want);
        free(out);
    }
    return NULL;
}

/* One compiled template, rendered from several threads at once. */
static void test_threads(void)
{
    const char *src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                      "{{ m.role|upper }}:{{ m.content|trim }};{% endfor %}{{ ns.n }}"
                      "{{ 'héllo'|length }}{{ 'wörld'[1:3] }}{{ 'ab'.find('b') }}";
    struct err e = {{0}};
    struct jinja_template *t = jinja_compile(src, strlen(src), &e);
    CHECK(t != NULL, "compile: %s", e.msg);
    if (!t)
        return;
    json_error_t je;
    json_t *vars = json_loads(VARS, 0, &je);
    struct thread_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thread_arg){t, vars, "SYSTEM:Sys;USER:hi there;ASSISTANT:ok;35ör1", 0};
        pthread_create(&th[i], NULL, render_many, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(args[i].ok == 200, "thread %d: %d of 200 renders right", i, args[i].ok);
    }
    json_decref(vars);
    jinja_free(t);
}

/* --dump: the tables as JSON, for tests/fixtures/check_jinja_cases.py */
static int dump(void)
{
    json_error_t je;
    json_t *root = json_object();
    json_object_set_new(root, "vars", json_loads(VARS, 0, &je));
    json_t *c = json_array(), *er = json_array();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        json_array_append_new(c, json_pack("{s:s, s:s}", "template", cases[i].tpl, "output",
                                           cases[i].want));
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        json_array_append_new(er, json_pack("{s:s, s:s}", "template", errors[i].tpl, "error",
                                            errors[i].err));
    json_object_set_new(root, "cases", c);
    json_object_set_new(root, "errors", er);
    json_dumpf(root, stdout, JSON_INDENT(1) | JSON_ENSURE_ASCII);
    json_decref(root);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--dump"))
        return dump();
    setenv("TZ", "UTC", 1);
    tzset();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect(cases[i].tpl, VARS, cases[i].want);
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        expect_err(errors[i].tpl, VARS, NULL, errors[i].err);
    test_extras();
    test_api_errors();
    test_limits();
    test_threads();
    return test_summary("test_jinja");
}
