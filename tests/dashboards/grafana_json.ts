// Types the dashboards in dashboards/ are checked against (check_dashboards.mjs).
//
// Grafana's own schema types (@grafana/schema) describe the dashboard model;
// a JSON file cannot hold a TypeScript enum, only its value, so Json<T>
// turns every string enum into the union of its values and leaves the rest
// of the shape, optional and excess properties included, as Grafana has it.

import type { Options as StatPanelOptions } from '@grafana/schema/dist/types/raw/composable/stat/panelcfg/x/types.gen';
import type {
  FieldConfig as TimeSeriesFieldConfigRaw,
  Options as TimeSeriesPanelOptions,
} from '@grafana/schema/dist/types/raw/composable/timeseries/panelcfg/x/types.gen';

export type Json<T> = T extends string
  ? `${T}`
  : T extends readonly (infer U)[]
    ? Json<U>[]
    : T extends object
      ? { [K in keyof T]: Json<T[K]> }
      : T;

export type TimeSeriesOptions = Json<TimeSeriesPanelOptions>;
export type TimeSeriesFieldConfig = Json<TimeSeriesFieldConfigRaw>;
export type StatOptions = Json<StatPanelOptions>;

// A Prometheus panel query. @grafana/schema 13.2.3 has no type for the
// Prometheus data source's query (panel targets are Record<string,
// unknown> there), so these are the fields of its query model
// (DataQuery's plus PromQuery's) that a dashboard may set.
export interface PromQuery {
  refId: string;
  expr: string;
  datasource?: { type?: string; uid?: string };
  hide?: boolean;
  queryType?: string;
  legendFormat?: string;
  range?: boolean;
  instant?: boolean;
  exemplar?: boolean;
  format?: 'time_series' | 'table' | 'heatmap';
  interval?: string;
  intervalFactor?: number;
  editorMode?: 'code' | 'builder';
}
