"""Project-wide pytest configuration: registers the GCS emulator fixtures
(tests/gcs_emulators.py: ``gcs_emulator``, ``fake_gcs``, ``fake_google_auth``), and marks the slow tests.

The suite has two tiers.  ``scripts/test.sh`` runs everything; ``scripts/test.sh --quick``
(``pytest -m "not slow"``) leaves out the tests listed in SLOW below, which is every test that trains
a network, runs a whole role, the loop or a benchmark, or plays many games: a change can be checked
in a minute or two, and every package keeps tests in the quick tier.  SLOW is the one place a test is
marked slow (no ``@pytest.mark.slow`` in the test files).  tests/system/test_lint.py fails when an entry
names a test that does not exist (renamed or removed), or when a package's tests would all be slow.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

pytest_plugins = ["tests.gcs_emulators"]

TESTS = pathlib.Path(__file__).resolve().parent
WHOLE_FILE = "*"

# test file (relative to tests/) -> the slow test functions in it (every parametrization), or WHOLE_FILE.
# A test whose module-scoped fixture is expensive goes together with every test that uses the fixture,
# or the cost only moves to the next test.
SLOW: dict[str, str | tuple[str, ...]] = {
    "arena/test_analysis.py": ("test_the_command_answers_a_published_models_analysis_on_stdin",),
    "arena/test_elo_coverage.py": WHOLE_FILE,          # one simulation of 300 tournaments, shared (lru_cache)
    "arena/test_gtp.py": ("test_engine_plays_a_published_model",),
    "arena/test_lizzie.py": WHOLE_FILE,                 # the real Lizzie on Xvfb: about 25 s
    "arena/test_gtp_analysis.py": WHOLE_FILE,           # trains the model the analysis sessions use
    "arena/test_ladder.py": ("test_the_ladder_plays_its_schedule_then_only_missing_games",
                             "test_repeated_games_count_once_and_old_lines_get_their_digest_from_the_sgf",
                             "test_gnugo_anchors_play_through_the_match_players",
                             "test_the_report_says_what_the_fit_is_and_how_much_the_prior_moves_it"),
    "arena/test_match.py": ("test_search_beats_random_moves_on_9x9", "test_model_spec_plays_a_published_generation",
                            "test_gnugo_player_plays_a_game"),
    "arena/test_published_models.py": WHOLE_FILE,
    "arena/test_run_page.py": ("test_the_page_in_chromium_shows_what_inspect_and_the_ladder_compute",),
    "arena/test_sigterm.py": WHOLE_FILE,
    "bench/test_smoke.py": ("test_pipeline_bench_reports_both_9x9_windows_19x19_and_the_model_label_path",
                            "test_train_bench_reports_the_input_pipeline_and_the_training_rate",
                            "test_heldout_bench_scores_each_arm_on_another_runs_games",
                            "test_cluster_bench_on_the_emulator_reports_the_audit_and_its_acceptance",
                            "test_board_bench_reports_both_boards_and_the_naive_peer",
                            "test_gpu_feed_search_side_reports_its_keys"),
    "bench/test_replay.py": ("test_a_replay_trains_each_arm_alike_then_judges_it",),
    "engine/test_playouts.py": ("test_playout_values_match_python_playouts_on_average_and_are_reproducible",),
    "engine/test_rules_against_gnugo.py": ("test_random_games_agree_with_gnugo",),
    "format/test_planes.py": ("test_the_shuffle_job_and_training_dataset_deliver_the_reference_planes",
                              "test_tfdata_decodes_the_reference_planes_under_every_symmetry"),
    "format/test_policy_values.py": ("test_tfdata_decodes_the_worker_targets_and_trains_a_window",),
    "model/test_cpu_int8.py": WHOLE_FILE,               # quantizes a trained model (module fixture)
    "model/test_input_widths.py": ("test_a_22_plane_model_trains_publishes_and_plays_beside_a_17_plane_one",
                                   "test_a_manifest_whose_width_is_impossible_or_not_its_networks_is_refused_by_field"),
    "model/test_mirrored.py": WHOLE_FILE,
    "model/test_network.py": ("test_the_conv_policy_head_learns_a_rule_of_every_point_that_the_dense_head_does_not",),
    "model/test_staging_gcs.py":
        ("test_trainer_on_an_emulated_bucket_resumes_on_a_fresh_stage_dir_and_publishes_once",),
    "model/test_tfdata.py": ("test_order_is_reproducible_and_skip_resumes_the_same_stream",
                             "test_shard_round_trip_through_the_pipeline"),
    "model/test_train.py": ("test_tiny_run_lowers_every_heads_loss",
                            "test_an_accelerator_asked_for_and_absent_is_one_error"),
    "model/test_train_faults.py": ("test_a_window_skipped_for_damage_is_never_resumed_from_its_checkpoint",
                                   "test_following_skips_a_damaged_window_and_trains_the_next",
                                   "test_a_diverging_run_saves_and_publishes_nothing_and_says_so",
                                   "test_a_damaged_first_shard_met_by_the_int8_calibration_is_named_too",
                                   "test_a_checkpoint_that_cannot_be_written_is_one_line_and_releases_the_lease",
                                   "test_a_non_finite_weight_is_never_checkpointed",
                                   "test_a_damaged_shard_is_named_in_one_line_and_its_window_skipped"),
    "model/test_train_follow.py": ("test_follow_trains_the_newest_window_records_skips_and_stops_on_sigterm",
                                   "test_a_trainer_whose_lease_is_taken_stops_without_publishing",
                                   "test_sigterm_mid_window_saves_a_checkpoint_releases_the_lease_and_exits_0",
                                   "test_a_publish_killed_before_latest_moved_is_completed_not_retrained"),
    "model/test_train_resume.py": WHOLE_FILE,
    # gcloud --help of every command the plans use: about a minute until pytest's cache holds it.
    "operations/deploy/test_plan.py":
        ("test_every_gcloud_command_and_flag_is_documented_by_the_installed_gcloud",),
    "operations/deploy/test_release.py": ("test_every_gcloud_command_of_an_update_is_documented",),
    "operations/deploy/test_tpu.py":
        ("test_a_savedmodel_published_by_the_tpu_trainers_tensorflow_loads_in_the_workers",),
    "operations/deploy/test_vm.py":
        ("test_startup_retries_a_failed_install_until_it_succeeds_and_then_starts_the_role",),
    "operations/test_cluster.py": ("test_chaos_cluster_on_fake_gcs_loses_nothing",
                                   "test_each_child_gets_its_own_grace_and_a_hung_one_is_not_kept_for_a_longer_one"),
    "operations/test_loop.py": ("test_loop_on_a_gcs_root", "test_ctrl_c_mid_phase_loses_nothing_and_rerun_resumes",
                                "test_loop_runs_a_generation_and_resumes_as_done",
                                "test_the_concurrent_schedule_runs_every_role_at_once_and_resumes_after_a_stop",
                                "test_a_published_generation_without_an_evaluation_is_evaluated_on_resume"),
    "pipeline/test_dataflow.py": WHOLE_FILE,            # builds an sdist, and a fresh venv from it
    "pipeline/test_follow.py": ("test_a_follower_keeps_one_window_manifest_however_many_windows_it_reads",
                                "test_two_followers_publish_each_window_once_and_wait_for_new_games",
                                "test_an_expired_claim_of_a_killed_follower_is_taken_over",
                                "test_a_one_shot_job_stopped_by_sigterm_removes_its_pieces_and_releases_its_claim",
                                "test_the_follower_counts_the_windows_newer_than_latest"),
    "pipeline/test_job_pieces.py": ("test_resigned_games_are_played_out_and_agree_with_the_result",),
    "pipeline/test_labeller_model_copy.py": WHOLE_FILE,
    "pipeline/test_shuffle.py": ("test_a_write_that_fails_mid_job_is_one_line_naming_the_object",),
    "processes/test_renamed.py": ("test_an_old_name_forwards_to_the_new_program_with_one_warning",),
    "selfplay/test_spool.py": ("test_a_broken_model_never_makes_the_worker_play_generation_0",
                               "test_a_failing_bucket_keeps_games_spooled_and_retries",
                               "test_a_sigkilled_worker_on_a_gcs_emulator_root_loses_and_repeats_nothing"),
    "selfplay/test_worker.py": ("test_a_model_published_mid_run_is_picked_up_by_games_in_progress",
                                "test_sigkill_never_exposes_a_partial_chunk_and_a_restart_carries_on",
                                "test_sigterm_writes_every_finished_game_and_exits_0"),
    "selfplay/test_worker_models.py": ("test_the_watcher_checks_a_model_against_the_run_and_probes_it",
                                       "test_a_worker_whose_first_model_is_diverged_waits_for_a_good_one_and_never_plays_it",
                                       "test_a_worker_keeps_playing_its_model_when_a_misfit_or_a_diverged_one_is_published",
                                       "test_a_match_or_the_gtp_engine_refuses_a_diverged_model_in_one_line"),
    # The five tests that use the module's lake fixture (a shuffle run), and the trainer's.
    "system/test_bounded_reads.py": ("test_the_trainer_refuses_a_shard_whose_length_field_lies_before_tf_data_reads_it",
                                     "test_shuffle_job_skips_a_bomb_chunk_and_builds_the_window",
                                     "test_window_readers_refuse_a_bomb_shard_or_table",
                                     "test_a_shards_framing_is_checked_in_bounded_memory",
                                     "test_verify_names_the_bomb_and_checks_every_other_file"),
    "system/test_faults.py": ("test_stray_names_under_windows_are_passed_by",
                              "test_a_folder_named_with_a_unicode_digit_does_not_stop_the_follower",
                              "test_a_stray_name_in_a_dead_attempts_folder_does_not_stop_the_follower",
                              "test_a_tampered_object_is_named_never_a_traceback"),
    "system/test_flag_bounds.py": ("test_every_numeric_flag_refuses_absurd_values_in_one_line",),
    "system/test_lint.py": ("test_every_generated_plan_passes_shellcheck",),
    "system/test_no_telemetry.py": ("test_no_role_connects_anywhere_on_a_local_lake",),
}


def _test_functions(path: pathlib.Path) -> set[str]:
    """The names of the test functions a test file defines (read, not imported)."""
    tree = ast.parse(path.read_text(), str(path))
    return {node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")}


def slow_list_problems() -> list[str]:
    """What is wrong with SLOW: entries naming no test, and packages left with no quick test."""
    problems = []
    quick: dict[str, int] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        name = path.relative_to(TESTS).as_posix()
        functions = _test_functions(path)
        slow = SLOW.get(name, ())
        if slow != WHOLE_FILE:
            problems += [f"{name}::{function} does not exist" for function in slow if function not in functions]
            package = name.split("/")[0]
            quick[package] = quick.get(package, 0) + len(functions - set(slow))
    problems += [f"{name} does not exist" for name in SLOW if not (TESTS / name).is_file()]
    problems += [f"every test of tests/{package}/ is slow: leave some in the quick tier"
                 for package, count in sorted(quick.items()) if not count]
    problems += [f"every test of tests/{package}/ is slow: leave some in the quick tier"
                 for package in sorted({name.split("/")[0] for name in SLOW} - set(quick))]
    return problems


@pytest.hookimpl(tryfirst=True)   # before `-m "not slow"` deselects by the marks given here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = pathlib.Path(str(item.fspath)).resolve()
        if TESTS not in path.parents:
            continue
        slow = SLOW.get(path.relative_to(TESTS).as_posix())
        if slow == WHOLE_FILE or (slow is not None and getattr(item, "originalname", item.name) in slow):
            item.add_marker(pytest.mark.slow)
