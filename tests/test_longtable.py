"""rakv.experiments.longtable: a generated table float reset as an upright longtable, and the abstract's grouping of
configurations by the word their CIs give."""

import pytest

from rakv.runtime.errors import RakvError

FLOAT = ("\\begin{rakvtable}\\centering\\scriptsize\n\\fittable{%\n\\begin{tabular}{llr}\n\\toprule\n"
         "Configuration & ratio & n \\\\\n\\midrule\nsmollm2 & 0.37 [0.29, 0.47] & 4 \\\\\n"
         "smollm2-q4\\_1 & 1.00 & 4 \\\\\n\\bottomrule\n\\end{tabular}}\n"
         "\\caption{Ratios (95\\,\\% CI).}\\label{tab:x}\n\\end{rakvtable}")


def test_a_float_becomes_a_longtable_with_its_caption_label_head_and_rows():
    from rakv.experiments.longtable import as_longtable

    table = as_longtable(FLOAT)
    assert table.count("\\begin{longtable}") == 1 and "rakvtable" not in table and "fittable" not in table
    assert "\\caption{Ratios (95\\,\\% CI).\\label{tab:x}}\\\\" in table
    assert table.count("Configuration & ratio & n") == 2  # the head on the first page and repeated on the next
    assert "*{2}{" in table  # three columns: the first and two sharing the rest of the width
    assert "0.37\\newline[0.29, 0.47]" in table and "smollm2-q4\\_1 & 1.00 & 4" in table  # an interval stacked


@pytest.mark.parametrize("broken", [FLOAT.replace("\\caption{Ratios (95\\,\\% CI).}", ""),  # no caption
                                    FLOAT.replace("\\end{tabular}}",
                                                  "\\end{tabular}\\begin{tabular}{l}x\\end{tabular}}"),
                                    FLOAT.replace("\\begin{tabular}{llr}", "\\begin{tabular}{l}")])
def test_a_float_of_another_shape_is_refused(broken):
    from rakv.experiments.longtable import as_longtable

    with pytest.raises(RakvError):
        as_longtable(broken)


def test_columns_are_counted_through_column_types():
    from rakv.experiments.longtable import columns_of

    assert columns_of("llr") == 3
    assert columns_of("@{}>{\\raggedright\\arraybackslash}p{5.6cm}rrl@{}") == 4


def test_the_abstract_groups_configurations_by_the_word_their_interval_gives():
    from rakv.experiments.prose_abstract import grouped

    text = grouped([("a", (0.2, 0.1, 0.3)), ("b", (0.01, -0.02, 0.04)), ("c", (0.3, 0.2, 0.4)),
                    ("d", (-0.2, -0.3, -0.1)), ("e", None)])
    assert text == ("faster on \\texttt{a} (20.0\\%) and \\texttt{c} (30.0\\%), and not distinguishable on "
                    "\\texttt{b}, and slower on \\texttt{d} (20.0\\%), and not measured on \\texttt{e}")
    # control: the same numbers with b's interval moved above 0 join the faster group
    assert grouped([("a", (0.2, 0.1, 0.3)), ("b", (0.01, 0.005, 0.04))]).startswith(
        "faster on \\texttt{a} (20.0\\%) and \\texttt{b} (1.0\\%)")
