import type { LanguageModelV3 } from '@ai-sdk/provider';
import { generateText, stepCountIs, wrapLanguageModel, type ModelMessage, type ToolSet } from 'ai';
import type { SidecarClient } from '@context-sidecar/client';
import { sidecarContext } from '@context-sidecar/client/ai-sdk';

// One request of a chat: the conversation so far in (as it grew), the model's new messages out.
export async function chat(sidecar: SidecarClient, model: LanguageModelV3, messages: ModelMessage[], tools: ToolSet = {}) {
  const middleware = sidecarContext(sidecar, { run_id: 'chat-1',
    settings: { token_counter: 'o200k_base', transcript_token_budget: 8000 } });
  const result = await generateText({ model: wrapLanguageModel({ model, middleware }),
    system: 'You are a helpful assistant.', messages, tools, stopWhen: stepCountIs(5) });
  return result.response.messages;
}
