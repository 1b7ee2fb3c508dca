// One answer everywhere: for selections other than the default, the page's
// report JSON is `memcast estimate --json` with the same GPUs in the same
// order (the target first), and each what-if's JSON is the CLI's; the CLI's
// `--link` is the page's permalink byte for byte, opens as a shared estimate
// with the same numbers and settings, and an old `#e=v1.` link still opens.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { inflateRawSync } from "node:zlib";
import path from "node:path";
import {
  serveDist, launchBrowser, fixture, openApp, cliRun, bytesOf, screenshot, ROOT,
  allFixtures, reportJson, decodeLink,
} from "./harness.mjs";

let site;
let browser;
/** Every preset slug in the order the page lists them (`memcast presets --json`). */
let presetOrder;

before(async () => {
  site = await serveDist();
  browser = await launchBrowser();
  presetOrder = JSON.parse(cliRun(["presets", "--json"])).map((p) => p.preset);
  assert.ok(presetOrder.length > 10 && presetOrder.includes("a100-80gb"), `no presets: ${presetOrder}`);
});

after(async () => {
  await browser?.close();
  await site?.close();
});

const TRACE = fixture("resnet18_sgd_bs16_pos1.json.gz");

/**
 * Three selections other than the default, each as a user makes it: the
 * target GPU, the GPUs to compare it with, custom capacities, allocator
 * settings. The first is chosen before the drop, the others after it (a
 * re-simulation of the trace the worker holds).
 */
const SELECTIONS = [
  { label: "custom capacity", target: "l4", compare: ["t4", "rtx-4090", "a100-80gb"], customs: ["16000MiB"], allocConf: "" },
  { label: "pre-Ada target", target: "v100-16gb", compare: ["t4", "a10", "h100-80gb"], customs: [], allocConf: "" },
  { label: "allocator setting", target: "rtx-4090", compare: ["l4", "a100-40gb"], customs: [], allocConf: "expandable_segments:True" },
];

/** The GPUs in the order the page promises: the target, then the others as listed, then custom ones. */
function gpuOrder({ target, compare, customs }) {
  return [target, ...presetOrder.filter((s) => compare.includes(s) && s !== target), ...customs.filter((c) => c !== target)];
}

/** The CLI arguments for a selection. */
function cliArgs(selection) {
  const args = gpuOrder(selection).flatMap((g) => ["--gpu", g]);
  if (selection.allocConf) args.push("--alloc-conf", selection.allocConf);
  return args;
}

/** Sets the page's GPU and allocator choices; returns when the page is idle again. */
async function choose(page, { target, compare, customs, allocConf }) {
  for (const custom of customs) {
    if (!(await page.locator("#compare").evaluate((d) => d.open))) await page.click("#compare summary");
    await page.fill("#custom-gpu", custom);
    await page.press("#custom-gpu", "Enter");
  }
  await page.selectOption("#target-gpu", target);
  const details = page.locator("#compare");
  if (!(await details.evaluate((d) => d.open))) await page.click("#compare summary");
  for (const box of await page.locator("#gpu-list input[type=checkbox]").all()) {
    const slug = await box.getAttribute("value");
    const want = presetOrder.includes(slug) ? compare.includes(slug) : customs.includes(slug);
    if (!(await box.isDisabled()) && (await box.isChecked()) !== want) await box.click();
  }
  await page.fill("#alloc-conf", allocConf);
  await page.press("#alloc-conf", "Enter");
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
}


// [page button, CLI command, the page's title for it]
const WHATIFS = [
  ["#whatif-alloc", ["whatif", "alloc"], /Allocator settings/],
  ["#whatif-zero-grad", ["whatif", "zero-grad"], /zero_grad/],
  ["#whatif-plan", ["whatif", "plan"], /Planned allocation/],
  ["#whatif-precision", ["whatif", "precision"], /Mixed precision/],
  ["#whatif-distributed", ["whatif", "distributed", "--world-size", "8"], /8 GPUs/],
  ["#whatif-batch", ["batch"], /Batch size/],
];

async function whatifJson(page, button, title) {
  await page.click(button);
  await page.locator("#whatif-result h3", { hasText: title }).waitFor({ timeout: 60_000 });
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  if (!(await page.locator("#whatif-json-details").evaluate((d) => d.open))) {
    await page.click("#whatif-json-details summary");
  }
  return JSON.parse(await page.inputValue("#whatif-json"));
}

test("for three non-default selections the page's report and what-ifs are the CLI's, GPU for GPU", async () => {
  const { page, problems, requests } = await openApp(browser, site.url);
  const [first, ...others] = SELECTIONS;
  await choose(page, first);
  await page.setInputFiles("#file-input", TRACE);
  await page.locator("#peak-total-bytes").waitFor({ timeout: 60_000 });
  for (const selection of [first, ...others]) {
    if (selection !== first) await choose(page, selection);
    const expected = JSON.parse(cliRun(["estimate", "--json", TRACE, ...cliArgs(selection)]));
    const shown = await reportJson(page);
    assert.equal(shown.reference_gpu, selection.target, `${selection.label}: the target is the reference`);
    const order = gpuOrder(selection);
    assert.equal(order.length, 1 + selection.compare.filter((s) => s !== selection.target).length + selection.customs.length);
    assert.deepEqual(shown.gpus.map((g) => g.preset), order, `${selection.label}: GPU order`);
    assert.deepEqual(shown, expected, `${selection.label}: the page's report is the CLI's`);
    // The first screen answers for the target.
    assert.match(await page.textContent("#verdict"), new RegExp(selection.target));
    for (const [button, command, title] of WHATIFS) {
      const fromPage = await whatifJson(page, button, title);
      const fromCli = JSON.parse(cliRun([...command, "--json", TRACE, ...cliArgs(selection)]));
      assert.deepEqual(fromPage, fromCli, `${selection.label}: ${command.join(" ")}`);
    }
    await screenshot(page, `agree-${selection.label.replace(/ /g, "-")}`);
  }
  assert.deepEqual(problems, [], "the page threw");
  assert.deepEqual(requests.filter((u) => !u.startsWith(site.origin)), [], "requests left the origin");
  await page.close();
});

test("the CLI's --link is the page's permalink byte for byte, and opens with the same numbers and settings", async () => {
  const selection = SELECTIONS[2];
  const { page, problems } = await openApp(browser, site.url);
  await choose(page, selection);
  await page.setInputFiles("#file-input", TRACE);
  await page.locator("#peak-total-bytes").waitFor({ timeout: 60_000 });
  const pageLink = await page.inputValue("#permalink");
  assert.equal(await page.evaluate(() => location.href), pageLink, "the address bar carries the estimate");
  const cliLink = cliRun(["estimate", TRACE, "--link", site.url, ...cliArgs(selection)]).trim();
  assert.ok(cliLink.startsWith(site.url + "#e=v2."), cliLink);
  assert.equal(cliLink, pageLink, "estimate --link");

  // A what-if goes into the link too.
  await whatifJson(page, "#whatif-alloc", /Allocator settings/);
  const pageWhatifLink = await page.inputValue("#permalink");
  assert.notEqual(pageWhatifLink, pageLink);
  const cliWhatifLink = cliRun(["whatif", "alloc", TRACE, "--link", site.url, ...cliArgs(selection)]).trim();
  assert.equal(cliWhatifLink, pageWhatifLink, "whatif alloc --link");
  const numbers = async (p) => ({
    verdict: await p.textContent("#verdict"),
    total: await p.textContent("#peak-total-bytes"),
    gpus: await p.textContent("#gpu-table"),
    breakdown: await p.textContent("#breakdown-table"),
    whatif: await p.textContent("#whatif-table"),
  });
  const original = await numbers(page);
  await page.close();

  // Opened elsewhere: the same numbers, marked as shared, and the settings it was made with.
  const fresh = await launchBrowser();
  try {
    const other = await fresh.newPage();
    const otherRequests = [];
    other.on("request", (r) => otherRequests.push(r.url()));
    await other.goto(cliWhatifLink);
    await other.locator("#shared-banner").waitFor({ timeout: 30_000 });
    assert.match(await other.textContent("#shared-banner"), new RegExp(path.basename(TRACE).replace(/\./g, "\\.")));
    assert.deepEqual(await numbers(other), original);
    assert.equal(await other.inputValue("#target-gpu"), selection.target);
    assert.equal(await other.inputValue("#alloc-conf"), selection.allocConf);
    for (const slug of selection.compare) {
      assert.ok(await other.locator(`#gpu-list input[value="${slug}"]`).isChecked(), slug);
    }
    await screenshot(other, "cli-link-opened");
    assert.deepEqual(otherRequests.filter((u) => !u.startsWith(site.origin)), []);

    // Round trip: the trace dropped on the opened link is computed with the
    // link's settings and makes the same link again.
    await other.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
    await other.setInputFiles("#file-input", TRACE);
    await other.locator("#shared-banner").waitFor({ state: "detached", timeout: 60_000 });
    assert.equal(await other.inputValue("#permalink"), cliLink, "recomputed from the link's settings");
  } finally {
    await fresh.close();
  }
  assert.deepEqual(problems, [], "the page threw");
});

test("an old #e=v1. permalink still opens with its numbers", async () => {
  const fragment = readFileSync(path.join(ROOT, "tests", "data", "permalink-v1.txt"), "utf8").trim();
  assert.ok(fragment.startsWith("e=v1."));
  const payload = Buffer.from(fragment.slice("e=v1.".length), "base64url");
  const shared = JSON.parse(inflateRawSync(payload).toString("utf8"));
  const page = await browser.newPage();
  const problems = [];
  page.on("pageerror", (err) => problems.push(String(err)));
  await page.goto(`${site.url}#${fragment}`);
  await page.locator("#shared-banner").waitFor({ timeout: 30_000 });
  assert.match(await page.textContent("#shared-banner"), new RegExp(shared.trace.name.replace(/\./g, "\\.")));
  assert.equal(bytesOf(await page.textContent("#peak-total-bytes")), shared.report.peak.total_bytes);
  assert.equal(await page.inputValue("#target-gpu"), shared.report.reference_gpu);
  assert.deepEqual(problems, [], "the page threw");
  await page.close();
});


test("inference, forward-only, frozen and LoRA traces: the page's report is the CLI's, and shows the run kind, the recipe line and the parameter split", async () => {
  const { page, problems } = await openApp(browser, site.url);
  for (const file of allFixtures("traces-nograd").map((n) => fixture(n, "traces-nograd"))) {
    const name = path.basename(file);
    await page.setInputFiles("#file-input", file);
    await page.locator("#trace-name", { hasText: name }).waitFor({ timeout: 120_000 });
    await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
    const shown = await reportJson(page);
    const gpus = shown.gpus.map((g) => g.preset).flatMap((g) => ["--gpu", g]);
    const expected = JSON.parse(cliRun(["estimate", "--json", file, ...gpus]));
    assert.deepEqual(shown, expected, `${name}: the page's report is the CLI's`);
    const run = await page.textContent("#run-facts");
    assert.ok(run.startsWith(expected.summary.run_kind.replace(/_/g, " ")), `${name}: ${run}`);
    assert.ok(expected.summary.frozen_parameter_bytes > 0, `${name}: frozen parameters found`);
    assert.match(await page.textContent("#model-facts"), /trainable.*frozen/);
    const recipe = cliRun(["estimate", file, ...gpus]).split("\n").find((line) => line.startsWith("run: "));
    assert.equal(await page.textContent("#recipe-facts"), recipe.slice("run: ".length), `${name}: the recipe line is the CLI's`);
  }
  assert.deepEqual(problems, [], "the page threw");
  await page.close();
});

test("parameter figures typed on the page are the CLI's --params and --frozen-params, and the link carries them", async () => {
  const file = fixture("resnet18_frozen_sgd_bs16.json.gz", "traces-nograd");
  const { page, problems } = await openApp(browser, site.url);
  await page.setInputFiles("#file-input", file);
  await page.locator("#peak-total-bytes").waitFor({ timeout: 60_000 });
  const before = await reportJson(page);
  await page.click(".params-override summary");
  await page.fill("#params", "200MiB");
  await page.fill("#frozen-params", "190MiB");
  await page.press("#params", "Enter");
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  const shown = await reportJson(page);
  assert.equal(shown.summary.frozen_parameter_bytes, 190 * 2 ** 20, "the user's frozen part");
  assert.ok(shown.warnings.some((w) => w.code === "parameters_from_user"), "the report says the figure came from the user");
  assert.ok(shown.peak.allocated_bytes > before.peak.allocated_bytes, "more parameters, a higher peak");
  const gpus = shown.gpus.map((g) => g.preset).flatMap((g) => ["--gpu", g]);
  const figures = ["--params", "200MiB", "--frozen-params", "190MiB"];
  const expected = JSON.parse(cliRun(["estimate", "--json", file, ...gpus, ...figures]));
  assert.deepEqual(shown, expected, "the page's report is the CLI's with the same figures");
  const pageLink = await page.inputValue("#permalink");
  const settings = decodeLink(pageLink).settings;
  assert.equal(settings.params, "200MiB");
  assert.equal(settings.frozen_params, "190MiB");
  const cliLink = cliRun(["estimate", file, "--link", site.url, ...gpus, ...figures]).trim();
  assert.equal(cliLink, pageLink, "estimate --link with the figures");
  await screenshot(page, "params-override");
  await page.close();

  // The link restores the figures in the form.
  const other = await browser.newPage();
  await other.goto(pageLink);
  await other.locator("#shared-banner").waitFor({ timeout: 30_000 });
  assert.equal(await other.inputValue("#params"), "200MiB");
  assert.equal(await other.inputValue("#frozen-params"), "190MiB");
  await other.close();
  assert.deepEqual(problems, [], "the page threw");
});

test("autocast choices made on the page are the CLI's --autocast-dtype, --autocast-policy and --grad-scaler, and the link carries them", async () => {
  // A bf16 CPU-autocast training trace of this checkout's own (tests/data).
  const file = path.join(ROOT, "tests", "data", "traces", "resnet18_bf16_train.json.gz");
  const { page, problems } = await openApp(browser, site.url);
  await page.setInputFiles("#file-input", file);
  await page.locator("#peak-total-bytes").waitFor({ timeout: 60_000 });
  const before = await reportJson(page);
  await page.click(".autocast-options summary");
  await page.selectOption("#autocast-dtype", "fp16");
  await page.selectOption("#autocast-policy", "2.9");
  await page.check("#grad-scaler");
  await page.click(".autocast-options button[type=submit]");
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  const shown = await reportJson(page);
  const scaler = shown.summary.rules.find((r) => r.rule === "grad_scaler_state");
  assert.ok(scaler && scaler.blocks > 0, "GradScaler state is in the report");
  assert.notDeepEqual(shown.summary.rules, before.summary.rules, "the choices changed the orchestration");
  const gpus = shown.gpus.map((g) => g.preset).flatMap((g) => ["--gpu", g]);
  const choices = ["--autocast-dtype", "fp16", "--autocast-policy", "2.9", "--grad-scaler"];
  const expected = JSON.parse(cliRun(["estimate", "--json", file, ...gpus, ...choices]));
  assert.deepEqual(shown, expected, "the page's report is the CLI's with the same choices");
  const pageLink = await page.inputValue("#permalink");
  const settings = decodeLink(pageLink).settings;
  assert.equal(settings.autocast_dtype, "fp16");
  assert.equal(settings.autocast_policy, "2.9");
  assert.equal(settings.grad_scaler, true);
  const cliLink = cliRun(["estimate", file, "--link", site.url, ...gpus, ...choices]).trim();
  assert.equal(cliLink, pageLink, "estimate --link with the choices");
  // Another GPU re-simulates the same orchestration: the link keeps the choices.
  await page.selectOption("#target-gpu", "l4");
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  assert.equal(decodeLink(await page.inputValue("#permalink")).settings.autocast_dtype, "fp16");
  await screenshot(page, "autocast-options");
  await page.close();

  // The link restores the choices in the form.
  const other = await browser.newPage();
  await other.goto(pageLink);
  await other.locator("#shared-banner").waitFor({ timeout: 30_000 });
  assert.equal(await other.inputValue("#autocast-dtype"), "fp16");
  assert.equal(await other.inputValue("#autocast-policy"), "2.9");
  assert.equal(await other.isChecked("#grad-scaler"), true);
  await other.close();
  assert.deepEqual(problems, [], "the page threw");
});
