#if canImport(FoundationEssentials)
import FoundationEssentials
#else
import Foundation
#endif

/// One run of a flow for a subject.
public struct RunRecord: Sendable, Equatable, Codable {
    /// The run id, unique in the database.
    public var id: Int64
    /// The flow name.
    public var flow: String
    /// Whom the run is for (a device, a user; "default").
    public var subject: String
    /// The version of the flow code that started the run.
    public var flowVersion: String
    /// Where the run stands.
    public var status: RunStatus
    /// The step in flight (entered, not yet unhopped), or the step that failed.
    public var currentStep: String?
    /// The token an unhop of the in-flight step must present.
    public var currentToken: String?
    /// For a parked run: the stored change that unhops it (see ``WakeCondition``).
    public var wakeOn: WakeCondition?
    /// The engine incarnation that executes the run, if one holds it (see ``Incarnation``).
    public var owner: String?
    /// Until when `owner` holds the run, unless it renews the lease; after that another
    /// engine may take the run over (at once, when the owner's process is proven gone).
    public var leaseExpiresAt: Date?
    /// For a parked step with a timeout: when it times out.
    public var wakeAt: Date?
    /// When the run was started.
    public var createdAt: Date
    /// When the run last changed.
    public var updatedAt: Date
}

extension RunRecord {
    /// A run as recorded elsewhere (a test's fixture, another database's export).
    package init(
        id: Int64, flow: String, subject: String, flowVersion: String, status: RunStatus, currentStep: String? = nil,
        createdAt: Date = Date(timeIntervalSince1970: 0), updatedAt: Date = Date(timeIntervalSince1970: 0)
    ) {
        self.id = id
        self.flow = flow
        self.subject = subject
        self.flowVersion = flowVersion
        self.status = status
        self.currentStep = currentStep
        self.createdAt = createdAt
        self.updatedAt = updatedAt
    }
}

extension RunRecord {
    /// The readable label of the engine that holds the run (its configured `engineID`), if one does.
    public var ownerLabel: String? { owner.map(Incarnation.label(of:)) }

    /// Whether the owner's lease on the run is still live at `now`.
    public func leaseIsLive(at now: Date = Date()) -> Bool {
        guard owner != nil, let leaseExpiresAt else { return false }
        return leaseExpiresAt >= now
    }
}
