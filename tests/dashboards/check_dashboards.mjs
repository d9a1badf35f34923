// Type-checks Grafana dashboards against Grafana's schema types with tsc.
//
//   node check_dashboards.mjs --tools tests/tools --out DIR dashboards/*.json
//
// For each dashboard it writes DIR/<name>.ts holding the whole JSON as
// `… satisfies Json<Dashboard>` (@grafana/schema's dashboard model: excess or
// misspelled properties are errors, as are wrong types and enum values) and,
// per panel, its options and custom field config against the panel plugin's
// types (timeseries, stat; any other panel type is refused here) and its
// queries against PromQuery (grafana_json.ts). Then it writes a few broken
// copies of one dashboard (a misspelled property at each level, a
// wrong enum value) and runs tsc once over everything: it passes when the
// real dashboards have no error and every broken copy has one (so a schema
// check that accepts anything fails the test). Exit 0: pass; 1: fail.

import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

const args = process.argv.slice(2);
let tools = '', out = '';
const files = [];
for (let i = 0; i < args.length; ++i) {
  if (args[i] === '--tools') tools = path.resolve(args[++i]);
  else if (args[i] === '--out') out = path.resolve(args[++i]);
  else files.push(path.resolve(args[i]));
}
const tsc = path.join(tools, 'node_modules/.bin/tsc');
const schema = path.join(tools, 'node_modules/@grafana/schema');
if (!fs.existsSync(tsc) || !fs.existsSync(schema)) {
  console.error(`FAIL: ${tsc} or ${schema} missing: ./tandem setup installs the test tools (tests/tools)`);
  process.exit(1);
}
if (!out || files.length === 0) {
  console.error('usage: check_dashboards.mjs --tools DIR --out DIR DASHBOARD.json...');
  process.exit(1);
}
fs.rmSync(out, { recursive: true, force: true });
fs.mkdirSync(out, { recursive: true });
const helpers = path.join(path.dirname(new URL(import.meta.url).pathname), 'grafana_json.ts');

const panelChecks = {
  timeseries: (p, id) => [
    `export const ${id}_options = (${JSON.stringify(p.options)}) satisfies TimeSeriesOptions;`,
    `export const ${id}_custom = (${JSON.stringify(p.fieldConfig?.defaults?.custom ?? {})}) satisfies Partial<TimeSeriesFieldConfig>;`,
  ],
  stat: (p, id) => [`export const ${id}_options = (${JSON.stringify(p.options)}) satisfies StatOptions;`],
};

// The TypeScript source that checks one dashboard; throws on a panel type
// this check has no types for.
function source(dashboard) {
  const lines = [
    `import type { Dashboard } from '@grafana/schema';`,
    `import type { Json, PromQuery, StatOptions, TimeSeriesFieldConfig, TimeSeriesOptions } from ${JSON.stringify(helpers.replace(/\.ts$/, ''))};`,
    `export const dashboard = (${JSON.stringify(dashboard, null, 2)}) satisfies Json<Dashboard>;`,
  ];
  const panels = (dashboard.panels ?? []).flatMap((p) => [p, ...(p.type === 'row' ? p.panels ?? [] : [])]);
  panels.forEach((p, i) => {
    if (p.type === 'row') return;
    const check = panelChecks[p.type];
    if (!check) throw new Error(`panel ${JSON.stringify(p.title)}: type ${p.type} has no types here (timeseries, stat, row)`);
    lines.push(...check(p, `panel${i}`));
    lines.push(`export const panel${i}_targets = (${JSON.stringify(p.targets ?? [])}) satisfies PromQuery[];`);
  });
  return lines.join('\n') + '\n';
}

// Broken copies of a dashboard: each must fail the check.
function breakages(d) {
  const copy = () => structuredClone(d);
  const firstPanel = (x) => x.panels.find((p) => p.type !== 'row');
  const firstStat = (x) => x.panels.find((p) => p.type === 'stat');
  const firstSeries = (x) => x.panels.find((p) => p.type === 'timeseries');
  const rename = (o, from, to) => { o[to] = o[from]; delete o[from]; };
  const cases = {
    'misspelled dashboard property': (x) => rename(x, 'title', 'titel'),
    'misspelled panel property': (x) => rename(firstPanel(x), 'gridPos', 'gridPoss'),
    'misspelled query property': (x) => rename(firstPanel(x).targets[0], 'expr', 'exp'),
    'misspelled variable property': (x) => rename(x.templating.list[1], 'query', 'querry'),
    'wrong variable type': (x) => { x.templating.list[1].type = 'querry'; },
    'wrong threshold mode': (x) => { firstStat(x).fieldConfig.defaults.thresholds.mode = 'absolut'; },
    'misspelled timeseries option': (x) => rename(firstSeries(x).options, 'legend', 'legnd'),
    'wrong legend placement': (x) => { firstSeries(x).options.legend.placement = 'top'; },
    'misspelled field config': (x) => rename(firstSeries(x).fieldConfig.defaults, 'unit', 'units'),
    'misspelled custom field config': (x) => rename(firstSeries(x).fieldConfig.defaults.custom, 'lineWidth', 'linewidth'),
    'schemaVersion a string': (x) => { x.schemaVersion = '42'; },
  };
  return Object.entries(cases).map(([what, f]) => { const x = copy(); f(x); return [what, x]; });
}

const good = [], broken = [];
let failed = false;
for (const f of files) {
  const name = path.basename(f, '.json');
  const file = path.join(out, `${name}.ts`);
  try {
    fs.writeFileSync(file, source(JSON.parse(fs.readFileSync(f, 'utf8'))));
  } catch (e) {
    console.error(`FAIL ${f}: ${e.message}`);
    failed = true;
    continue;
  }
  good.push(file);
}
// The broken copies start from a dashboard with both panel types.
const first = files.map((f) => JSON.parse(fs.readFileSync(f, 'utf8')))
  .find((d) => ['stat', 'timeseries'].every((t) => (d.panels ?? []).some((p) => p.type === t)));
if (!first) {
  console.error('FAIL no dashboard has both a stat and a timeseries panel to make broken copies of');
  process.exit(1);
}
breakages(first).forEach(([what, d], i) => {
  const file = path.join(out, `broken_${i}.ts`);
  fs.writeFileSync(file, source(d));
  broken.push([what, file]);
});

fs.writeFileSync(path.join(out, 'tsconfig.json'), JSON.stringify({
  compilerOptions: {
    strict: true, noEmit: true, target: 'es2022', module: 'esnext', moduleResolution: 'bundler',
    skipLibCheck: true, types: [],
    paths: { '@grafana/schema': [path.join(schema, 'dist/types/index.d.ts')], '@grafana/schema/*': [path.join(schema, '*')] },
  },
  files: [...good, ...broken.map(([, f]) => f)],
}, null, 2));

let output = '';
try {
  output = execFileSync(tsc, ['-p', path.join(out, 'tsconfig.json'), '--pretty', 'false'], { encoding: 'utf8' });
} catch (e) {
  output = (e.stdout ?? '') + (e.stderr ?? '');
}
const errors = output.split('\n').filter((l) => / error TS\d+:/.test(l));
const errorsIn = (file) => errors.filter((l) => l.startsWith(file + '(') || l.startsWith(path.relative(process.cwd(), file) + '('));
for (const file of good) {
  const e = errorsIn(file);
  if (e.length) {
    failed = true;
    console.error(`FAIL ${path.basename(file, '.ts')}.json does not satisfy Grafana's types:\n  ${e.join('\n  ')}`);
  } else {
    console.log(`ok   ${path.basename(file, '.ts')}.json`);
  }
}
for (const [what, file] of broken) {
  const e = errorsIn(file);
  if (e.length === 0) {
    failed = true;
    console.error(`FAIL a dashboard with a ${what} passed the check (${file})`);
  } else {
    console.log(`ok   rejected: ${what}: ${e[0].replace(/^.*error /, '')}`);
  }
}
const elsewhere = errors.filter((l) => ![...good, ...broken.map(([, f]) => f)].some((f) => errorsIn(f).includes(l)));
if (elsewhere.length) {
  failed = true;
  console.error(`FAIL tsc errors outside the checked files:\n  ${elsewhere.join('\n  ')}`);
}
if (!output.trim() && broken.length) failed = true;
process.exit(failed ? 1 : 0);
