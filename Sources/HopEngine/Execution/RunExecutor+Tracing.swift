import Tracing

/// The spans of an execution: one per execution of a run (`run <flow>`), and one per step it
/// enters (`step <step>`), a child of the run's. Their attributes name the flow, subject, run
/// id, flow version, step and how each ended (`hop.outcome`); a span that ended by an error
/// records it. Nothing secret goes into a span: no session token, no hop token, no output.
extension RunExecutor {
    /// Attribute keys, in the `hop.` namespace the engine's log metadata uses.
    enum SpanKey {
        static let flow = "hop.flow"
        static let subject = "hop.subject"
        static let runID = "hop.run_id"
        static let version = "hop.flow_version"
        static let step = "hop.step"
        static let outcome = "hop.outcome"
        static let replayed = "hop.replayed"
        static let attempts = "hop.attempts"
        static let reentry = "hop.reentry"
    }

    /// How a run's execution or a step ended, as `hop.outcome` says it.
    enum SpanOutcome: String {
        /// The run's body returned and its completion is recorded.
        case completed
        /// The run or step waits for an external step to be unhopped.
        case parked
        /// The step unhopped.
        case unhopped
        /// The step's deadline passed before it unhopped.
        case timedOut = "timed_out"
        /// A change of stored state ended the step.
        case rerouted
        /// The run was cancelled, restarted or taken over elsewhere: this execution wrote nothing more.
        case finishedElsewhere = "finished_elsewhere"
        /// Another engine holds the run, or it no longer runs: this execution never started it.
        case notClaimed = "not_claimed"
        /// The engine stopped (shutdown) or the database failed: the run stays resumable; or a
        /// step was ended from outside as it returned here: the run is executed again.
        case interrupted
        /// The run's history no longer matches its flow's code.
        case diverged
        /// A step failed for good, or the flow's body threw.
        case failed
    }

    /// Starts the span of this execution, a child of the task's current context.
    func startRunSpan() -> any Span {
        let span = environment.tracer.startSpan("run \(run.flow)", context: InstrumentationContext.current ?? .topLevel)
        guard span.isRecording else { return span }  // no attributes to build for a span that drops them
        span.updateAttributes { attributes in
            attributes[SpanKey.flow] = run.flow
            attributes[SpanKey.subject] = run.subject
            attributes[SpanKey.runID] = run.id
            attributes[SpanKey.version] = run.flowVersion
        }
        return span
    }

    /// Starts the span of entering `step`, a child of the run's span (the task's current context).
    func startStepSpan(_ step: String, isReentry: Bool) -> any Span {
        let span = environment.tracer.startSpan("step \(step)", context: InstrumentationContext.current ?? .topLevel)
        guard span.isRecording else { return span }
        span.updateAttributes { attributes in
            attributes[SpanKey.flow] = run.flow
            attributes[SpanKey.subject] = run.subject
            attributes[SpanKey.runID] = run.id
            attributes[SpanKey.step] = step
            attributes[SpanKey.reentry] = isReentry
        }
        return span
    }

    /// Says on `span` how a run's execution or a step ended by `error`, recording the error
    /// when it is one (parking and being finished elsewhere are not).
    static func outcome(of span: any Span, endedBy error: any Error) {
        switch error {
        case Suspension.parked:
            span.setAttribute(SpanKey.outcome, SpanOutcome.parked.rawValue)
        case Suspension.finished:
            span.setAttribute(SpanKey.outcome, SpanOutcome.finishedElsewhere.rawValue)
        case Suspension.endedElsewhere:
            span.setAttribute(SpanKey.outcome, SpanOutcome.interrupted.rawValue)
        case _ where Task.isCancelled:
            span.setAttribute(SpanKey.outcome, SpanOutcome.interrupted.rawValue)
        case let failure as HopError where failure.code == .diverged:
            span.setAttribute(SpanKey.outcome, SpanOutcome.diverged.rawValue)
            failed(span, by: error)
        case let failure as HopError where failure.isDatabaseFailure:
            span.setAttribute(SpanKey.outcome, SpanOutcome.interrupted.rawValue)
            failed(span, by: error)
        default:
            span.setAttribute(SpanKey.outcome, SpanOutcome.failed.rawValue)
            failed(span, by: error)
        }
    }

    /// Says on `span` that a step ended with `output`.
    static func outcome(of span: any Span, endedWith output: StepOutput) {
        let outcome: SpanOutcome =
            switch output.ending {
            case .unhopped: .unhopped
            case .timedOut: .timedOut
            case .rerouted: .rerouted
            }
        span.setAttribute(SpanKey.outcome, outcome.rawValue)
    }

    /// Records `error` on `span` and marks the span failed.
    static func failed(_ span: any Span, by error: any Error) {
        span.recordError(error)
        span.setStatus(SpanStatus(code: .error))
    }
}

extension Span {
    /// Sets the attribute `key` to `value` on a span that records attributes; a span that drops
    /// them (the no-op tracer's, the default) costs no attribute dictionary.
    func setAttribute(_ key: String, _ value: some SpanAttributeConvertible) {
        guard isRecording else { return }
        attributes[key] = value
    }
}
