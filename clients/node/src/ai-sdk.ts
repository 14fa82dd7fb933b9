// The Vercel AI SDK integration: a language-model middleware that keeps the conversation in a
// sidecar run. Before every model call (each step of generateText, streamText or an Agent) it
// records the prompt's messages the run does not hold yet, as that call's turn, with
// AssembleContext, and hands the model the window the sidecar fed instead of the whole history.

import type { LanguageModelMiddleware } from 'ai';

import type { SidecarClient } from './client.js';
import type { DeepPartial, Event, OpenRunRequest, WindowEntry } from './gen/contextsidecar/v1/sidecar.js';

type CallOptions = Parameters<NonNullable<LanguageModelMiddleware['transformParams']>>[0]['params'];
type Prompt = CallOptions['prompt'];
type Message = Prompt[number];
type ToolResultOutput = Extract<Message, { role: 'tool' }>['content'][number] extends infer Part
  ? Part extends { type: 'tool-result'; output: infer Output } ? Output : never : never;

export interface SidecarContextOptions {
  /** The run that keeps the conversation: one middleware (one wrapped model) per conversation. */
  run_id: string;
  /** The run's settings, sent with OpenRun before the first call (token_counter,
   * transcript_token_budget, ...); an existing run must have the same ones. */
  settings?: Omit<DeepPartial<OpenRunRequest>, 'run_id'>;
  /** Tightens the run's budget for every call (AssembleContext's max_transcript_tokens). */
  max_transcript_tokens?: number;
}

// An event's id names the prompt message and the part it came from, so a middleware made again
// for the same conversation (a new request of a chat route) finds where the run's record ends.
const EVENT_ID = /^m(\d+)\.\d+$/;

/**
 * Record each model call's new messages in the sidecar and feed the model its window.
 *
 * The prompt's leading system messages pass through unchanged (they are the host's instructions,
 * not history); every later message is history. The history must grow by appending, as the AI SDK's
 * steps and a chat's messages do: message i of the history is recorded once, as events `m{i}.{part}`
 * (one per text, tool-call or tool-result part; reasoning parts are not kept), in the turn of the
 * first model call that sees it. Each model call is one iteration of the run.
 */
export function sidecarContext(client: SidecarClient, options: SidecarContextOptions): LanguageModelMiddleware {
  const { run_id: runId } = options;
  let position: Promise<Position> | null = null;

  async function readPosition(): Promise<Position> {
    const opened = await client.openRun({ ...options.settings, run_id: runId });
    const at: Position = { recorded: 0, iteration: 0, last: [] };
    if (!opened.created) {
      for (let from_seq: number | undefined = 0; from_seq !== undefined;) {
        const page = await client.listRunEvents({ run_id: runId, from_seq, limit: 1000 });
        for (const event of page.events) {
          at.iteration = Math.max(at.iteration, event.iteration);
          const message = EVENT_ID.exec(event.event_id);
          if (!message) continue;
          if (Number(message[1]) + 1 > at.recorded) [at.recorded, at.last] = [Number(message[1]) + 1, []];
          if (Number(message[1]) + 1 === at.recorded) at.last.push(shape(event));
        }
        from_seq = page.next_from_seq;
      }
    }
    return at;
  }

  return {
    specificationVersion: 'v3',
    async transformParams({ params }) {
      position ??= readPosition().catch((error: unknown) => {
        position = null; // read again at the next call
        throw error;
      });
      const at = await position;
      const instructions = leadingSystemMessages(params.prompt);
      const history = params.prompt.slice(instructions.length);
      if (history.length < at.recorded) {
        throw new RangeError(`run ${runId} holds ${at.recorded} messages of this conversation, the prompt ${history.length}: `
          + 'pass the whole history, as it grew, to the model wrapped for this run');
      }
      // The history must extend what the run holds: its last recorded message is still in place.
      const lastRecorded = at.recorded > 0 ? messageEvents(history[at.recorded - 1], at.recorded - 1, 0).map(shape) : [];
      if (JSON.stringify(lastRecorded) !== JSON.stringify(at.last)) {
        throw new RangeError(`run ${runId} recorded message ${at.recorded - 1} of this conversation as ${JSON.stringify(at.last)}, `
          + `the prompt has ${JSON.stringify(lastRecorded)} there: pass the whole history, as it grew`);
      }
      const iteration = at.iteration + 1;
      const append_events = history.slice(at.recorded).flatMap((message, offset) =>
        messageEvents(message, at.recorded + offset, iteration));
      const turn = await client.assembleContext({ run_id: runId, iteration, append_events,
        max_transcript_tokens: options.max_transcript_tokens });
      const recorded = Math.max(at.recorded, history.length);
      const last = recorded > at.recorded ? messageEvents(history[recorded - 1], recorded - 1, 0).map(shape) : at.last;
      position = Promise.resolve({ recorded, iteration, last });
      return { ...params, prompt: [...instructions, ...windowMessages(turn.entries)] };
    },
  };
}

/** Where the run's record of the conversation ends: the history messages recorded, the last
 * iteration assembled, and the last recorded message's events, by shape. */
interface Position {
  recorded: number;
  iteration: number;
  last: string[];
}

/** An event's shape: what the sidecar keeps of it as sent (its content may be redacted; an empty
 * type is stored as "message"). */
function shape(event: DeepPartial<Event>): string {
  return [event.event_id, event.role, event.type || 'message', event.call_id ?? '', event.tool_name ?? ''].join(' ');
}

function leadingSystemMessages(prompt: Prompt): Prompt {
  const first = prompt.findIndex((message) => message.role !== 'system');
  return first === -1 ? prompt : prompt.slice(0, first);
}

function messageEvents(message: Message, index: number, iteration: number): DeepPartial<Event>[] {
  const event = (part: number, fields: DeepPartial<Event>): DeepPartial<Event> =>
    ({ event_id: `m${index}.${part}`, iteration, role: message.role, ...fields });
  if (message.role === 'system') return [event(0, { content: message.content })];
  const events: DeepPartial<Event>[] = [];
  message.content.forEach((part, at) => {
    switch (part.type) {
      case 'text':
        events.push(event(at, { content: part.text }));
        break;
      case 'tool-call':
        events.push(event(at, { type: 'tool_call', call_id: part.toolCallId, tool_name: part.toolName,
          content: JSON.stringify(part.input ?? {}) }));
        break;
      case 'tool-result':
        events.push(event(at, { role: 'tool', type: 'tool_result', call_id: part.toolCallId,
          content: resultText(part.output) }));
        break;
      case 'reasoning': // the model's own thoughts: providers do not take them back either
      case 'tool-approval-response':
        break;
      default:
        throw new TypeError(`the sidecar keeps text: a ${part.type} part of a ${message.role} message cannot be recorded`);
    }
  });
  return events;
}

function resultText(output: ToolResultOutput): string {
  switch (output.type) {
    case 'text':
    case 'error-text':
      return output.value;
    case 'json':
    case 'error-json':
      return JSON.stringify(output.value);
    case 'execution-denied':
      return `execution denied${output.reason ? `: ${output.reason}` : ''}`;
    case 'content':
      return output.value.map((item) => (item.type === 'text' ? item.text : `[${item.type}]`)).join('\n');
    default:
      return JSON.stringify(output);
  }
}

/** The window's entries as the model's messages: consecutive entries of a role make one message,
 * a tool call's text (its arguments, always a JSON object, even clipped) is its input. */
export function windowMessages(entries: readonly WindowEntry[]): Prompt {
  const toolNames = new Map(entries.filter((entry) => entry.type === 'tool_call')
    .map((entry) => [entry.call_id, entry.tool_name]));
  const messages: Prompt = [];
  for (const entry of entries) {
    const last = messages.at(-1);
    if (entry.role === 'system') {
      messages.push({ role: 'system', content: entry.text });
    } else if (entry.role === 'tool') {
      const part = { type: 'tool-result' as const, toolCallId: entry.call_id,
        toolName: toolNames.get(entry.call_id) ?? '', output: { type: 'text' as const, value: entry.text } };
      if (last?.role === 'tool') last.content.push(part);
      else messages.push({ role: 'tool', content: [part] });
    } else if (entry.role === 'assistant') {
      const part = entry.type === 'tool_call'
        ? { type: 'tool-call' as const, toolCallId: entry.call_id, toolName: entry.tool_name, input: JSON.parse(entry.text) as unknown }
        : { type: 'text' as const, text: entry.text };
      if (last?.role === 'assistant') last.content.push(part);
      else messages.push({ role: 'assistant', content: [part] });
    } else {
      const part = { type: 'text' as const, text: entry.text };
      if (last?.role === 'user') last.content.push(part);
      else messages.push({ role: 'user', content: [part] });
    }
  }
  return messages;
}
