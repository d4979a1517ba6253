"""The browser tier's order: longest test first, so that the two pytest-xdist workers end together.

``--dist loadgroup`` hands each worker the next test of the collection whenever it holds two or
fewer (no browser test is in an ``xdist_group``), so the order of the collection is the order of the
work. In file order the tier ended on four ~30-s Grad-CAM tests (test_vision_browser.py), one
worker alone with them while the other had finished; longest first, it ends on the few-second
export tests. The figures are one whole-tier run's per-test seconds (junit ``time``: set-up, call and
tear-down, on the shared 2-core machine, ``tests/browser/README.md``); they set the order only, so
they need not be exact. A test not listed counts as :data:`UNKNOWN_S`.

``tests/conftest.py`` (``LONG_FIRST``, applied after this) then moves whole files to the front:
the README screenshot, grouped-view and tutorial files, which hold the tier's longest tests anyway.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
UNKNOWN_S = 30

SECONDS = {
    "test_readme_screenshots_browser.py::test_readme_screenshot_cam_methods": 203,
    "test_readme_screenshots_browser.py::test_readme_screenshots_real_models": 140,
    "test_vision_browser.py::test_gradcam_in_notebook7": 60,
    "test_vision_browser.py::test_gradcam_slider_is_local_and_syncs_back": 55,
    "test_tutorial_browser.py::test_tutorial_1_notebook7": 51,
    "test_patching_browser.py::test_patching_lab": 49,
    "test_vision_browser.py::test_gradcam_methods_switch_and_faithfulness_curves": 44,
    "test_steer_lens_browser.py::test_steer_lens_lab": 43,
    "test_nb7_browser.py::test_thermometer_keys_notebook7": 42,
    "test_thermometer_browser.py::test_thermometer_notebook7": 41,
    "test_dashboard_browser.py::test_views_that_do_not_apply_are_one_line_and_create_no_widget": 40,
    "test_findings_browser.py::test_the_finding_is_the_header_while_the_loop_runs": 39,
    "test_nb7_browser.py::test_grouped_view_notebook7": 39,
    "test_nb7_browser.py::test_live_thermometer_notebook7": 38,
    "test_run_browser.py::test_run_view_lab": 37,
    "test_harness_browser.py::test_harness_notebook7": 37,
    "test_findings_browser.py::test_digits_lr3_header_loss_curve_contrast_and_narrow_layout": 36,
    "test_thermometer_browser.py::test_thermometer_lab": 35,
    "test_tutorial_browser.py::test_tutorial_1_lab": 35,
    "test_nb7_browser.py::test_doctor_notebook7": 35,
    "test_groups_browser.py::test_grouped_view_follows_the_step_slider_lab": 34,
    "test_nb7_browser.py::test_run_view_notebook7": 34,
    "test_attribution_browser.py::test_tokens_and_method_switch": 34,
    "test_vision_browser.py::test_feature_grid_draws_and_enlarges": 34,
    "test_groups_browser.py::test_grouped_thermometer_1600_rows_lab": 31,
    "test_compare_browser.py::test_compare_two_learning_rates": 31,
    "test_language_browser.py::test_language_views_notebook7": 30,
    "test_attribution_browser.py::test_pick_a_generated_token": 29,
    "test_groups_browser.py::test_grouped_view_live_while_the_cell_runs_lab": 29,
    "test_language_findings_browser.py::test_findings_filter_colour_bar_contrast_at_800px_lab": 29,
    "test_ablate_attention_browser.py::test_ablate_a_head_in_the_attention_view": 28,
    "test_live_browser.py::test_live_thermometer_lab": 26,
    "test_dashboard_browser.py::test_thermometer_click_opens_layer_in_feature_grid_and_gradcam": 26,
    "test_groups_browser.py::test_thermometer_grouped_view_lab": 25,
    "test_language_browser.py::test_language_views_lab": 25,
    "test_ablate_thermometer_browser.py::test_ablate_a_thermometer_row_lab": 23,
    "test_language_browser.py::test_1024_tokens_lab": 22,
    "test_ablate_vision_browser.py::test_ablate_channel_lab": 21,
    "test_cam_panel_browser.py::test_cam_panel_sanity_before_rank_ties_and_one_verdict": 20,
    "test_doctor_browser.py::test_doctor_lab": 16,
    "test_one_grammar_browser.py::test_no_view_hides_content_in_a_scroll_box_without_a_cue": 15,
    "test_harness_browser.py::test_harness_lab": 15,
    "test_one_grammar_browser.py::test_attribution_and_patching_draw_toward_the_answer_in_the_same_colour": 7,
    "test_harness_browser.py::test_cell_errors_surface_with_traceback": 5,
    "test_export_browser.py::test_attention_export": 4,
    "test_export_browser.py::test_logitlens_export": 2,
    "test_export_browser.py::test_thermometer_export": 2,
    "test_export_browser.py::test_featuremaps_export_and_missing_answer": 2,
    "test_export_browser.py::test_gradcam_export": 1,
    "test_dashboard_browser.py::test_console_errors_fail_the_page_check": 1,
    "test_harness_browser.py::test_page_errors_are_caught": 1,
    "test_harness_browser.py::test_missing_chromium_fails_in_ci": 1,
    "test_labpage_browser.py::test_reused_lab_page_is_clean_and_refuses_leftovers": 20,
}


def _key(item: pytest.Item) -> str:
    return f"{Path(str(item.fspath)).name}::{getattr(item, 'originalname', item.name)}"


def longest_first(items: list[pytest.Item]) -> None:
    """Reorder the browser tests among themselves (in place), longest first; other items keep their
    places. Stable: equal estimates keep the collection's order."""
    slots = [i for i, item in enumerate(items) if HERE in Path(str(item.fspath)).resolve().parents]
    ordered = sorted((items[i] for i in slots), key=lambda item: -SECONDS.get(_key(item), UNKNOWN_S))
    for i, item in zip(slots, ordered):
        items[i] = item
