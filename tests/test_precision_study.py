"""Precision as a factor of the study (issue 62): configurations at fp32 and q4_1 of one pair and proposer keep
apart calibrations, the study runs a target at q4_1 through its plumbing (the tiny pair, quantised at load), and the
analysis sets each proposer's regime at the two precisions side by side."""



from rakv.runtime.run_layout import RunLayout, calibration_stem, split_calibration_stem


def test_the_calibrations_of_one_pair_and_proposer_at_two_precisions_never_share_a_file(tmp_path):
    layout = RunLayout.of(tmp_path)
    fp32, q4 = layout.calibration("smollm2", "draft"), layout.calibration("smollm2", "draft", "q4_1")
    assert fp32.name == "smollm2-draft.json"  # the shipped runs' names stay
    assert q4 != fp32 and q4.name == "smollm2-draft@q4_1.json"
    assert layout.calibration("smollm2", "draft", "int8") not in (fp32, q4)
    for pair, proposer, precision in (("smollm2", "prompt-lookup", "q4_1"), ("tiny", "draft", "fp32")):
        assert split_calibration_stem(calibration_stem(pair, proposer, precision)) == (f"{pair}-{proposer}",
                                                                                        precision)


def test_a_configurations_calibration_is_keyed_by_its_precision():
    from rakv.experiments.calibrations import configuration_stem

    assert configuration_stem("smollm2") == "smollm2-draft"
    assert configuration_stem("smollm2-q4_1") == "smollm2-draft@q4_1"
    assert configuration_stem("smollm2-lookup-q4_1") == "smollm2-prompt-lookup@q4_1"
    assert configuration_stem("smollm2-lookup") != configuration_stem("smollm2-lookup-q4_1")


def test_a_calibration_records_what_the_kernels_compile_for():
    import torch

    from rakv.runtime.calibration import hardware_fingerprint
    from rakv.runtime.kernels import target_isa

    record = hardware_fingerprint(torch.device("cpu"), "float32")
    assert record["kernels_isa"] == target_isa() and record["kernels_isa"].count("+") == 1
    assert record["kernels_march"]  # beside the -march string it resolves


def test_the_precision_a_loaded_pair_runs_at_is_read_off_its_target():
    from rakv.runtime.calibration import precision_of
    from rakv.runtime.models import load_pair

    assert precision_of(load_pair("tiny")) == "fp32"
    assert precision_of(load_pair("tiny", precision="q4_1")) == "q4_1"
    assert precision_of(load_pair("tiny", precision="int8")) == "int8"
