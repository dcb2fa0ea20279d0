"""scripts/check_ptxas.py on lines of ptxas's -v report as ptxas writes them (no CUDA compile
here): which lines are findings (a serialised warpgroup product or an injected wait anywhere, an
injected arrive in a tma kernel), which are tolerated arrives (the older wgmma kernels), the
tma kernels' register and spill table, and which spills are findings (a tma forward kernel
without segment ids)."""

import repo_module

check_ptxas = repo_module.load("scripts/check_ptxas.py")

TMA_FWD = "_ZN2ft9attention4cuda10tma_detail18tma_forward_kernelILi6ELb0EEEvNS2_14TmaForwardArgsE"
TMA_BWD = ("_ZN2ft9attention4cuda14tma_bwd_detail19tma_backward_kernelILi3ELb1EEEvNS2_15"
           "TmaBackwardArgsE")
WGMMA = ("_ZN2ft9attention4cuda12wgmma_detail20wgmma_forward_kernelILi64ELi64ELi64ELi128ELb0EEEvNS1"
         "_11FlashParamsE")


def info(text):
    return "ptxas info    : " + text


def test_serialised_products_and_injected_waits_are_findings_in_any_kernel():
    for fn in (TMA_FWD, WGMMA):
        serialised = info("(C7515) Potential Performance Loss: wgmma.mma_async instructions are "
                          "serialized due to non wgmma instructions defining accumulator registers "
                          f"of a wgmma between start and end of the pipeline stage in the function "
                          f"'{fn}'")
        waited = info(f"(C7517) warpgroup.wait is injected in around line 81350 by compiler to "
                      f"allow use of registers defined by GMMA in function '{fn}'")
        assert check_ptxas.classify(serialised) == "finding"
        assert check_ptxas.classify(waited) == "finding"


def test_an_injected_arrive_is_a_finding_in_a_tma_kernel_and_tolerated_elsewhere():
    line = ("(C7519) warpgroup.arrive is injected in around line 21159 by compiler to allow use "
            "of registers in GMMA in function '{}'")
    assert check_ptxas.classify(info(line.format(TMA_BWD))) == "finding"
    assert check_ptxas.classify(info(line.format(WGMMA))) == "arrive"


def test_ordinary_report_lines_are_not_findings():
    for line in (f"Compiling entry function '{TMA_FWD}' for 'sm_90a'",
                 f"Function properties for {TMA_FWD}",
                 "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
                 "Used 168 registers, used 16 barriers"):
        assert check_ptxas.classify(info(line)) is None


def test_the_table_has_each_tma_kernel_with_its_registers_and_spills():
    report = "\n".join([
        info(f"Compiling entry function '{TMA_FWD}' for 'sm_90a'"),
        info(f"Function properties for {TMA_FWD}"),
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
        info("Used 168 registers, used 16 barriers"),
        info(f"Compiling entry function '{WGMMA}' for 'sm_90a'"),
        info(f"Function properties for {WGMMA}"),
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
        info("Used 128 registers, used 1 barriers"),
        info(f"Compiling entry function '{TMA_BWD}' for 'sm_90a'"),
        info(f"Function properties for {TMA_BWD}"),
        "    88 bytes stack frame, 196 bytes spill stores, 224 bytes spill loads",
        info("Used 168 registers, used 16 barriers, 88 bytes cumulative stack size"),
    ])
    rows = check_ptxas.kernel_table(report)
    assert rows == [(TMA_FWD, 168, 0, 0), (TMA_BWD, 168, 196, 224)]
    assert check_ptxas.short_name(TMA_FWD) == "tma_forward_kernel<6, false>"
    assert check_ptxas.short_name(TMA_BWD) == "tma_backward_kernel<3, true>"
    assert check_ptxas.short_name(WGMMA) == WGMMA


def test_spills_are_findings_only_in_tma_forward_kernels_without_segment_ids():
    seg_fwd = TMA_FWD.replace("ILi6ELb0E", "ILi6ELb1E")
    assert check_ptxas.spills_where_none_expected(TMA_FWD, 168, 4, 4)
    assert not check_ptxas.spills_where_none_expected(TMA_FWD, 168, 0, 0)
    assert not check_ptxas.spills_where_none_expected(seg_fwd, 168, 36, 56)
    assert not check_ptxas.spills_where_none_expected(TMA_BWD, 168, 196, 224)
